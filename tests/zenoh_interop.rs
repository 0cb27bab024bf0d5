//! pi0d over Zenoh against an independent peer written with the `eclipse-zenoh` Python package
//! and rosbags' CDR, speaking rmw_zenoh's wire format (key expressions with the domain, DDS type
//! name and type hash; CDR payloads; 33-byte attachments; liveliness tokens), on loopback TCP.

#![cfg(feature = "zenoh")]

mod common;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use toml::Value;

fn zenoh_config(domain: u16, port: u16) -> toml::Table {
    let mut cfg = sim_config();
    cfg["robot"]["io"] = Value::String("ros".into());
    let mut ros = toml::Table::new();
    ros.insert("middleware".into(), Value::String("zenoh".into()));
    ros.insert("domain_id".into(), Value::Integer(domain as i64));
    ros.insert("loopback_only".into(), Value::Boolean(true));
    ros.insert(
        "zenoh_connect".into(),
        Value::Array(vec![Value::String(format!("tcp/127.0.0.1:{port}"))]),
    );
    ros.insert(
        "cameras".into(),
        Value::Array(vec![
            Value::String("/camera/image_raw".into()),
            Value::String("/wrist/image_raw/compressed".into()),
        ]),
    );
    cfg.insert("ros".into(), Value::Table(ros));
    cfg["safety"]["joint_state_timeout_s"] = Value::Float(0.3);
    cfg
}

/// Starts the Zenoh peer on `port` and waits until it listens.
fn zenoh_peer(
    domain: u16,
    port: u16,
    report: &std::path::Path,
    peer_args: &[&str],
) -> std::process::Child {
    let peer = Command::new(peer_python())
        .arg(root().join("tests/peers/zenoh_robot_peer.py"))
        .args(["--listen", &format!("tcp/127.0.0.1:{port}")])
        .args(["--domain", &domain.to_string(), "--report"])
        .arg(report)
        .args(peer_args)
        .stdout(Stdio::null())
        .spawn()
        .expect("peer starts");
    // pi0d connects to the peer's endpoint: wait until it listens.
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the Zenoh peer never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    peer
}

/// The liveliness tokens the peer listed (rmw_zenoh's view of pi0d's node and entities).
fn tokens(report: &serde_json::Value) -> Vec<&str> {
    report["liveliness"]
        .as_array()
        .unwrap_or_else(|| panic!("no liveliness list: {report}"))
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect()
}

fn exchange(name: &str, domain: u16, peer_args: &[&str], pi0d_s: f64) -> Exchange {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir(name);
    let port = free_port();
    let cfg = zenoh_config(domain, port);
    let peer = zenoh_peer(domain, port, &dir.join("peer.json"), peer_args);
    run_beside_peer(&dir, &cfg, peer, pi0d_s)
}

#[test]
fn when_zenoh_joint_states_come_on_another_topic_expect_the_start_up_error_to_name_it() {
    let domain = 30 + ((std::process::id() + 61) % 150) as u16;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("zenoh-wrong-topic");
    let port = free_port();
    let cfg = zenoh_config(domain, port);
    let peer = zenoh_peer(
        domain,
        port,
        &dir.join("peer.json"),
        &[
            "--duration",
            "13",
            "--joint-states-topic",
            "/robot/joint_states",
        ],
    );
    let (code, stderr) = run_until_it_stops(&dir, &cfg, peer);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains("nothing arrived; JointState published on the graph: /robot/joint_states (sensor_msgs/msg/JointState, samples arriving)"),
        "{stderr}"
    );
}

#[test]
fn when_zenoh_robot_publishes_expect_commands_back_in_rmw_zenoh_format() {
    let domain = 30 + (std::process::id() % 150) as u16;
    let x = exchange("zenoh-interop", domain, &["--duration", "8"], 5.0);
    let (s, r, stderr) = (&x.summary, &x.report, &x.stderr);
    assert_eq!(s["limit_violations"], 0);
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 3, "{s}\n{stderr}");
    assert!(r["commands"].as_u64().unwrap() >= 200, "peer got {r}");
    assert_eq!(r["nonfinite"], 0);
    assert_eq!(r["undecodable"], 0);
    assert_eq!(r["joint_names"][6], "gripper", "{r}");
    let moved: f64 = r["first"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["last"].as_array().unwrap())
        .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
        .sum();
    assert!(moved > 0.01, "commands did not move the arm: {r}");
    // rmw_zenoh's wire format: the key carries domain, topic, DDS type and a RIHS01 hash; every
    // sample an attachment of sequence number, timestamp and GID, numbered upwards.
    let hash = |t: &str| pi0d::testing::ros::type_hash(t).unwrap();
    let key = r["keys"][0].as_str().unwrap();
    assert_eq!(
        key,
        format!(
            "{domain}/arm_controller/joint_trajectory/trajectory_msgs::msg::dds_::JointTrajectory_/{}",
            hash("trajectory_msgs/msg/JointTrajectory")
        ),
        "the real REP-2016 hash, as an rmw_zenoh subscriber expects it"
    );
    assert_eq!(r["attachment_lengths"], serde_json::json!([33]), "{r}");
    // Type hashes: the peer sent its inputs with the real REP-2016 hashes (rmw_zenoh's keys),
    // the same as pi0d's table; pi0d's String publications carry the real hash too.
    for (ty, hash) in pi0d::testing::ros::TYPE_HASHES {
        if let Some(sent) = r["sent_hashes"].get(*ty) {
            assert_eq!(sent, *hash, "{ty}");
        }
    }
    assert!(r["sent_hashes"].as_object().unwrap().len() >= 5, "{r}");
    let status_key = r["status_keys"][0].as_str().unwrap();
    assert_eq!(
        status_key,
        format!(
            "{domain}/pi0d/status/std_msgs::msg::dds_::String_/{}",
            pi0d::testing::ros::type_hash("std_msgs/msg/String").unwrap()
        )
    );
    assert_eq!(r["seq_increasing"], true);
    // Discovery: pi0d's node and its command publisher announce themselves as rmw_zenoh nodes do.
    let tokens = tokens(r);
    assert!(
        tokens
            .iter()
            .any(|t| t.contains("/NN/") && t.ends_with("/pi0d")),
        "{tokens:?}"
    );
    let command_token = tokens
        .iter()
        .find(|t| t.contains("/MP/") && t.contains("%arm_controller%joint_trajectory/"))
        .unwrap_or_else(|| panic!("no command publisher token: {tokens:?}"));
    assert!(
        command_token.contains(&format!(
            "/pi0d/%arm_controller%joint_trajectory/trajectory_msgs::msg::dds_::JointTrajectory_/{}/",
            hash("trajectory_msgs/msg/JointTrajectory")
        )),
        "{command_token}"
    );
    // Same node (session and node id) and QoS encoding as the node's own subscriptions, which
    // ros2-client declares (the prompt: reliable, keep last 10, like the command publisher).
    let prompt_token = tokens
        .iter()
        .find(|t| t.contains("/MS/") && t.contains("%pi0d%prompt/"))
        .unwrap_or_else(|| panic!("no prompt subscription token: {tokens:?}"));
    let parts = |t: &str| t.split('/').map(String::from).collect::<Vec<_>>();
    let (c, p) = (parts(command_token), parts(prompt_token));
    assert_eq!(
        c[..4],
        p[..4],
        "session and node: {command_token} vs {prompt_token}"
    );
    assert_eq!(c.last(), p.last(), "QoS: {command_token} vs {prompt_token}");
    // Inputs reached the daemon: the prompt, both cameras (fresh in the diagnostics).
    assert!(stderr.contains("stack the blocks"), "{stderr}");
    // pi0d's own tokens are not taken for someone else's.
    assert!(!stderr.contains("someone else on pi0d's names"), "{stderr}");
    assert!(r["statuses"].as_u64().unwrap() >= 2, "{r}");
    let diags = r["diagnostics"].as_array().unwrap();
    let running = diags
        .iter()
        .find(|d| d["message"] == "running")
        .unwrap_or_else(|| panic!("no running diagnostic: {r}"));
    for cam in ["camera 0 age (s)", "camera 1 age (s)"] {
        let age: f64 = running["values"][cam].as_str().unwrap().parse().unwrap();
        assert!((0.0..0.5).contains(&age), "{cam} {age}");
    }
    // Observation latency (capture stamp to decoded frame) per camera, and command latency
    // (control tick to the peer), both measured and plausible on loopback.
    assert_latencies(running, r);
    // config/sim.toml: 6 rad/s² and 150 rad/s³ for the arm joints.
    assert_controller_accepts(r, 6.0, 150.0);
}

#[test]
fn when_zenoh_peer_presses_estop_then_calls_reset_service_expect_latch_and_resume() {
    let domain = 30 + ((std::process::id() + 77) % 150) as u16;
    let peer = [
        "--duration",
        "9",
        "--estop-at",
        "2.5",
        "--reset-at",
        "4",
        "--bad-reset-first",
    ];
    let x = exchange("zenoh-estop", domain, &peer, 7.5);
    assert_estop_latched_then_reset(&x);
    // A call without rmw_zenoh's attachment went unanswered and was reported; the next one
    // (with the real hash in its key, as rmw_zenoh's clients send it) was served.
    assert_eq!(x.report["bad_reset_replies"], 0, "{}", x.report);
    assert!(
        x.stderr.contains("no attachment (rmw_zenoh's clients send"),
        "{}",
        x.stderr
    );
}

/// The gripper behind gripper_action_controller over Zenoh: `gripper_command` goals sent as an
/// rmw_zenoh action client sends them (a query on the send_goal service's key with the real
/// type hash, the request's attachment, a client liveliness token). The peer plays the
/// controller as rmw_zenoh serves it: it accepts every goal with a new id, forwards its position
/// to the joint, from 4.5 s on refuses every goal (a controller that went inactive) and from
/// 5.5 s on answers with 3 bytes that are no response, both of which pi0d must report.
#[test]
fn when_zenoh_gripper_is_behind_gripper_action_controller_expect_goals_it_accepts_and_refusals_reported(
) {
    let domain = 30 + ((std::process::id() + 93) % 150) as u16;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("zenoh-gripper-action");
    let port = free_port();
    let mut cfg = zenoh_config(domain, port);
    let (arm, action) = (ARM, GRIPPER_ACTION);
    with_gripper_action(&mut cfg);
    let peer = zenoh_peer(
        domain,
        port,
        &dir.join("peer.json"),
        &[
            "--duration",
            "10",
            "--gripper-action",
            action,
            "--refuse-goals-after",
            "4.5",
            "--garble-replies-after",
            "5.5",
        ],
    );
    let x = run_beside_peer(&dir, &cfg, peer, 7.0);
    let (s, r) = (&x.summary, &x.report);
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert_eq!(r["joint_names"], serde_json::json!(arm), "{r}");
    // rmw_zenoh's service wire format: the key with the send_goal service's real REP-2016 hash,
    // every request with a 33-byte attachment and sequence numbers the server takes.
    let hash =
        pi0d::testing::ros::type_hash("control_msgs/action/GripperCommand_SendGoal").unwrap();
    let dds = "control_msgs::action::dds_::GripperCommand_SendGoal_";
    assert_eq!(
        r["goal_keys"],
        serde_json::json!([format!(
            "{domain}/gripper_controller/gripper_cmd/_action/send_goal/{dds}/{hash}"
        )]),
        "{r}"
    );
    assert_eq!(r["goal_attachments"], serde_json::json!([33]), "{r}");
    assert_eq!(r["bad_goal_requests"], 0, "{r}");
    // Every goal: a fresh id, the URDF's effort limit (20 N), a position within the joint's
    // limits, at most ~20 a second; the refusals after 4.5 s reported.
    let accepted = assert_gripper_goals(r, &x.stderr, action, 20.0, 0.0..=0.04, 10);
    // The gripper followed the accepted goals.
    let spread = accepted.iter().cloned().fold(f64::MIN, f64::max)
        - accepted.iter().cloned().fold(f64::MAX, f64::min);
    assert!(
        spread > 1e-3,
        "the goals did not move the gripper: {accepted:?}"
    );
    assert_eq!(r["gripper_last"], *accepted.last().unwrap());
    // A reply that is no send_goal response is reported, and the daemon ran on to its end.
    let goals = r["gripper_goals"].as_array().unwrap();
    assert!(
        goals.iter().any(|g| g["at"].as_f64().unwrap() >= 5.5),
        "no goal came after 5.5 s: {r}"
    );
    assert!(
        x.stderr
            .contains("a reply of 3 bytes is not a send_goal response"),
        "{}",
        x.stderr
    );
    // Discovery: a service client token for the send_goal service, on pi0d's node.
    let tokens = tokens(r);
    assert!(
        tokens.iter().any(|t| t.contains("/SC/")
            && t.contains(&format!(
                "/pi0d/%gripper_controller%gripper_cmd%_action%send_goal/{dds}/{hash}/"
            ))),
        "no send_goal client token: {tokens:?}"
    );
}

/// The arm's joints, commanded as a joint_trajectory output beside the gripper's action.
const ARM: [&str; 6] = [
    "shoulder_pan",
    "shoulder_lift",
    "elbow",
    "wrist_1",
    "wrist_2",
    "wrist_3",
];
const GRIPPER_ACTION: &str = "/gripper_controller/gripper_cmd";

/// `cfg`'s commands: the arm on /arm_controller/joint_trajectory, the gripper as
/// gripper_command goals on `GRIPPER_ACTION`.
fn with_gripper_action(cfg: &mut toml::Table) {
    let output = |joints: &[&str], topic: &str, kind: &str| {
        let mut t = toml::Table::new();
        let joints = joints
            .iter()
            .map(|j| Value::String(j.to_string()))
            .collect();
        t.insert("joints".into(), Value::Array(joints));
        t.insert("topic".into(), Value::String(topic.into()));
        t.insert("type".into(), Value::String(kind.into()));
        Value::Table(t)
    };
    cfg["ros"].as_table_mut().unwrap().insert(
        "commands".into(),
        Value::Array(vec![
            output(&ARM, "/arm_controller/joint_trajectory", "joint_trajectory"),
            output(&["gripper"], GRIPPER_ACTION, "gripper_command"),
        ]),
    );
}

/// A robot on rmw_zenoh's Humble build, which writes `TypeHashNotSupported` where later
/// releases put a type's hash and matches it exactly: with `ros.zenoh_type_hashes = false`,
/// pi0d's commands, status, diagnostics and gripper goals reach it on those keys, and its
/// e-stop and reset call reach pi0d.
#[test]
fn when_zenoh_robot_runs_humble_expect_every_output_on_its_keys_and_the_reset_served() {
    let domain = 30 + ((std::process::id() + 111) % 150) as u16;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("zenoh-humble");
    let port = free_port();
    let mut cfg = zenoh_config(domain, port);
    cfg["ros"]
        .as_table_mut()
        .unwrap()
        .insert("zenoh_type_hashes".into(), Value::Boolean(false));
    with_gripper_action(&mut cfg);
    let peer = zenoh_peer(
        domain,
        port,
        &dir.join("peer.json"),
        &[
            "--humble",
            "--duration",
            "9",
            "--gripper-action",
            GRIPPER_ACTION,
            "--estop-at",
            "2.5",
            "--reset-at",
            "4",
        ],
    );
    let x = run_beside_peer(&dir, &cfg, peer, 6.5);
    let r = &x.report;
    assert_estop_latched_then_reset(&x);
    assert!(r["commands"].as_u64().unwrap() >= 200, "peer got {r}");
    assert_eq!(r["undecodable"], 0, "{r}");
    let none = "TypeHashNotSupported";
    assert_eq!(
        r["keys"],
        serde_json::json!([format!(
            "{domain}/arm_controller/joint_trajectory/trajectory_msgs::msg::dds_::JointTrajectory_/{none}"
        )])
    );
    assert_eq!(
        r["status_keys"],
        serde_json::json!([format!(
            "{domain}/pi0d/status/std_msgs::msg::dds_::String_/{none}"
        )])
    );
    assert!(!r["diagnostics"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(
        r["goal_keys"],
        serde_json::json!([format!(
            "{domain}/gripper_controller/gripper_cmd/_action/send_goal/control_msgs::action::dds_::GripperCommand_SendGoal_/{none}"
        )])
    );
    assert_eq!(r["bad_goal_requests"], 0, "{r}");
    let accepted = r["gripper_goals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["accepted"] == true)
        .count();
    assert!(accepted >= 10, "{accepted} goals accepted: {r}");
    // Discovery: pi0d's command publisher announces the same placeholder.
    let tokens = tokens(r);
    assert!(
        tokens.iter().any(|t| t.contains("/MP/")
            && t.contains(&format!(
                "%arm_controller%joint_trajectory/trajectory_msgs::msg::dds_::JointTrajectory_/{none}/"
            ))),
        "{tokens:?}"
    );
}

#[test]
fn when_a_peer_floods_estop_reset_prompt_and_malformed_strings_at_10_khz_expect_a_few_lines_and_counts(
) {
    let domain = 30 + ((std::process::id() + 97) % 150) as u16;
    let x = exchange(
        "zenoh-flood",
        domain,
        &[
            "--duration",
            "11",
            "--flood-at",
            "2",
            "--flood-s",
            "4",
            "--flood-hz",
            "10000",
        ],
        8.0,
    );
    let (s, r, stderr) = (&x.summary, &x.report, &x.stderr);
    let flooded = r["flooded"].as_u64().unwrap();
    assert!(flooded >= 20_000, "the peer sent {flooded}: {r}");
    // Each kind prints once per interval with the count of those held back; the CDR decoder's
    // own line per malformed string is not printed at all.
    let lines = stderr.lines().count();
    assert!(
        lines < 200,
        "{lines} lines for {flooded} messages:\n{stderr}"
    );
    for said in ["e-stop pressed", "reset requested", "task prompt"] {
        assert!(stderr.contains(said), "{said}:\n{stderr}");
    }
    assert!(!stderr.contains("null terminator"), "{stderr}");
    assert!(stderr.contains("suppressed="), "{stderr}");
    let suppressed = s["log_lines_suppressed"].as_u64().unwrap();
    assert!(
        suppressed >= flooded / 2,
        "{suppressed} suppressed of {flooded}: {s}"
    );
    assert_eq!(s["limit_violations"], 0, "{s}");
}

#[test]
fn when_a_joint_state_says_1e308_or_a_peer_takes_pi0ds_names_expect_a_sensor_fault_and_warnings() {
    let domain = 30 + ((std::process::id() + 113) % 150) as u16;
    let x = exchange(
        "zenoh-implausible",
        domain,
        &["--duration", "10", "--implausible-at", "3", "--impostor"],
        7.0,
    );
    let (s, r, stderr) = (&x.summary, &x.report, &x.stderr);
    assert!(r["implausible"].as_u64().unwrap() >= 100, "{r}");
    // Every such sample refused, named as a sensor fault; the watchdog held the arm meanwhile.
    assert!(
        s["inputs_rejected"].as_u64().unwrap() >= r["implausible"].as_u64().unwrap() / 2,
        "{s}"
    );
    assert!(stderr.contains("sensor fault"), "{stderr}");
    assert!(
        s["safety_events"]["stale_joint_state"].as_u64().unwrap() >= 1,
        "{s}"
    );
    assert_eq!(s["limit_violations"], 0, "{s}");
    // The commands the peer took never went anywhere near the reported position.
    let last = r["last"].as_array().unwrap();
    assert!(last[0].as_f64().unwrap().abs() < 4.0, "{r}");
    assert_eq!(r["nonfinite"], 0, "{r}");
    // The peer also declared, as rmw_zenoh would, a node named /pi0d and a publisher on pi0d's
    // command topic: both warned about and counted in the diagnostics.
    assert!(
        stderr.contains("1 other publisher(s) on pi0d's command topic(s)"),
        "{stderr}"
    );
    assert!(stderr.contains("1 other node(s) named /pi0d"), "{stderr}");
    let diags = r["diagnostics"].as_array().unwrap();
    let values = &diags
        .last()
        .unwrap_or_else(|| panic!("no diagnostics: {r}"))["values"];
    assert_eq!(values["other publishers on command topics"], "1", "{r}");
    assert_eq!(values["other nodes with this name"], "1", "{r}");
}
