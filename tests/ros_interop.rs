//! pi0d against an independent ROS 2 peer on loopback: a Python "robot" on Eclipse Cyclone DDS
//! (the DDS under rmw_cyclonedds) publishes joint states, camera images and a prompt, and
//! receives pi0d's JointTrajectory commands. Needs the peers' venv (`./tools/test.sh` makes it).

mod common;

use common::*;
use toml::Value;

fn ros_config(domain: u16) -> toml::Table {
    let mut cfg = sim_config();
    cfg["robot"]["io"] = Value::String("ros".into());
    let mut ros = toml::Table::new();
    ros.insert("domain_id".into(), Value::Integer(domain as i64));
    ros.insert("loopback_only".into(), Value::Boolean(true));
    // A raw camera and a JPEG one (image_transport's `/compressed` convention).
    ros.insert(
        "cameras".into(),
        Value::Array(vec![
            Value::String("/camera/image_raw".into()),
            Value::String("/wrist/image_raw/compressed".into()),
        ]),
    );
    cfg.insert("ros".into(), Value::Table(ros));
    // The peer stamps with its wall clock and delivers over DDS: allow for discovery hiccups.
    cfg["safety"]["joint_state_timeout_s"] = Value::Float(0.3);
    cfg
}

/// Runs the peer (`peer_args` added) and pi0d (`pi0d_s` seconds) side by side on `domain`.
fn exchange(
    name: &str,
    cfg: &toml::Table,
    domain: u16,
    peer_args: &[&str],
    pi0d_s: f64,
) -> Exchange {
    exchange_with(name, cfg, domain, peer_args, pi0d_s, &[])
}

/// As `exchange`, with `pi0d_args` added to `pi0d run`.
fn exchange_with(
    name: &str,
    cfg: &toml::Table,
    domain: u16,
    peer_args: &[&str],
    pi0d_s: f64,
    pi0d_args: &[&str],
) -> Exchange {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir(name);
    let peer = cyclone_peer(domain, &dir.join("peer.json"), peer_args);
    run_beside_peer_with(&dir, cfg, peer, pi0d_s, pi0d_args)
}

#[test]
fn when_cyclone_dds_robot_publishes_expect_commands_back_on_loopback() {
    let domain = 20 + (std::process::id() % 150) as u16;
    // A 150 ms stall of the control thread mid-motion (as a stalled host gives): the controller
    // runs the last command's look-ahead meanwhile (50 ms along it, then braking), and pi0d's
    // next command goes on from where that took the arm, so the controller models below see
    // neither a brake-back nor a jump forward.
    let mut cfg = ros_config(domain);
    add_drill(&mut cfg, "stall_control", 1.5, Some(0.15));
    let x = exchange("ros-interop", &cfg, domain, &["--duration", "9"], 5.0);
    let (s, r, stderr) = (&x.summary, &x.report, &x.stderr);
    assert_eq!(s["limit_violations"], 0);
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 3, "{s}");
    assert!(r["commands"].as_u64().unwrap() >= 200, "peer got {r}");
    assert_eq!(r["nonfinite"], 0);
    assert_eq!(
        strings(&r["joint_names"]),
        [
            "shoulder_pan",
            "shoulder_lift",
            "elbow",
            "wrist_1",
            "wrist_2",
            "wrist_3",
            "gripper"
        ]
    );
    // The commands moved the (peer's) arm away from where it started.
    assert!(moved(r) > 0.01, "commands did not move the arm: {r}");
    // The prompt sent by the peer reached the daemon.
    assert!(stderr.contains("stack the blocks"), "{stderr}");
    // The DDS stack's chatter (INFO) and its errors while it winds down on a clean exit are not
    // the operator's business.
    assert!(!stderr.contains("rustdds"), "{stderr}");
    assert!(r["statuses"].as_u64().unwrap() >= 2, "status topic: {r}");
    // Diagnostics at 1 Hz: state, rates and input ages a ROS user sees in rqt_runtime_monitor.
    let diags = r["diagnostics"].as_array().unwrap();
    assert!(diags.len() >= 2, "{r}");
    let running = diags
        .iter()
        .find(|d| d["message"] == "running")
        .expect("a running diagnostic");
    assert_eq!(running["level"], 0);
    // pi0d's own writers are not taken for someone else's.
    assert_eq!(running["values"]["other publishers on command topics"], "0");
    let age: f64 = running["values"]["joint state age (s)"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.0..0.3).contains(&age), "joint state age {age}");
    for cam in ["camera 0 age (s)", "camera 1 age (s)"] {
        let age: f64 = running["values"][cam].as_str().unwrap().parse().unwrap();
        assert!(
            (0.0..0.5).contains(&age),
            "{cam} {age}: frames decoded and fresh"
        );
    }
    // Observation latency (capture stamp to decoded frame) per camera, and command latency
    // (write to the peer), both measured and plausible on loopback.
    assert_latencies(running, r);
    // config/sim.toml: 6 rad/s² and 150 rad/s³ for the arm joints.
    assert_controller_accepts(r, 6.0, 150.0);
    eprintln!(
        "command inter-arrival at the peer: {}; first points off the ticks' timeline: {}",
        r["interarrival_ms"], r["timeline_error_ms"]
    );
}

#[test]
fn when_peer_presses_estop_then_calls_reset_service_expect_latch_and_fresh_resume() {
    let domain = 20 + ((std::process::id() + 77) % 150) as u16;
    let mut cfg = ros_config(domain);
    cfg["ros"]
        .as_table_mut()
        .unwrap()
        .insert("service_mapping".into(), Value::String("cyclone".into()));
    let peer = ["--duration", "10", "--estop-at", "3", "--reset-at", "4.5"];
    let x = exchange("ros-estop", &cfg, domain, &peer, 7.0);
    eprintln!(
        "e-stop sent at {} s, reset at {} s (after the first command); first points off the ticks' timeline: {}",
        x.report["estop_sent_s"], x.report["reset_sent_s"], x.report["timeline_error_ms"]
    );
    assert_estop_latched_then_reset(&x);
    // Through the e-stop's braking, the hold and the fresh resume, every trajectory is one
    // the controller accepts and follows smoothly.
    assert_controller_accepts(&x.report, 6.0, 150.0);
}

#[test]
fn when_sender_clock_lags_by_a_second_and_writes_on_the_command_topic_expect_both_reported() {
    let domain = 20 + ((std::process::id() + 133) % 150) as u16;
    let cfg = ros_config(domain);
    let peer = ["--duration", "7", "--clock-offset", "-1.0", "--impostor"];
    let x = exchange("ros-skew", &cfg, domain, &peer, 5.0);
    // Capture stamps a second old: the watchdog never lets the arm move, and the log says why.
    assert!(
        x.stderr.contains("clock skew between sender and pi0d"),
        "{}",
        x.stderr
    );
    assert_eq!(x.summary["chunks_accepted"], 0, "{}", x.summary);
    let d = x.report["diagnostics"].as_array().unwrap();
    let with_offset = d
        .iter()
        .filter_map(|d| d["values"]["joint state clock offset (s)"].as_str())
        .map(|v| v.parse::<f64>().unwrap())
        .collect::<Vec<_>>();
    assert!(!with_offset.is_empty(), "{}", x.report);
    assert!(
        with_offset.iter().all(|o| (0.99..1.2).contains(o)),
        "{with_offset:?}"
    );
    assert!(
        d.iter().all(|d| d["level"].as_u64().unwrap() >= 1),
        "never OK while skewed"
    );
    // The cameras' sender is estimated on its own, from the frames' stamps.
    assert!(
        x.stderr
            .contains("clock skew between the camera's sender and pi0d"),
        "{}",
        x.stderr
    );
    let camera_offsets: Vec<f64> = d
        .iter()
        .filter_map(|d| d["values"]["camera 1 clock offset (s)"].as_str())
        .map(|v| v.parse::<f64>().unwrap())
        .collect();
    assert!(!camera_offsets.is_empty(), "{}", x.report);
    assert!(
        camera_offsets.iter().all(|o| (0.99..1.2).contains(o)),
        "{camera_offsets:?}"
    );
    // The same peer opened a writer on pi0d's command topic: a second source of commands for
    // the controller, found in DDS discovery, warned about and counted.
    assert!(
        x.stderr
            .contains("1 other publisher(s) on pi0d's command topic(s)"),
        "{}",
        x.stderr
    );
    let last = &d.last().unwrap()["values"];
    assert_eq!(
        last["other publishers on command topics"], "1",
        "{}",
        x.report
    );
}

#[test]
fn when_peer_sends_malformed_images_and_prompts_expect_warnings_and_commands_keep_flowing() {
    let domain = 20 + ((std::process::id() + 41) % 150) as u16;
    let cfg = ros_config(domain);
    // Bad frames for a second from 2.5 s on (peer time), then good ones only; pi0d runs on.
    let peer = ["--duration", "9", "--bad-frames-at", "2.5"];
    // On a terminal, as an operator runs it: what the sender's strings do to the screen is read.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("ros-bad-frames");
    let peer = cyclone_peer(domain, &dir.join("peer.json"), &peer);
    let (x, screen) = common::run_beside_peer_on_terminal(&dir, &cfg, peer, 6.0, &[]);
    // A title sequence, a screen clear and a right-to-left override sent as prompts, and a
    // 1 MiB prompt: none acts on the terminal, the long one is named by its size, not shown.
    screen.assert_inert("PWNED", 256 * 1024);
    let stderr = &screen.plain();
    let r = &x.report;
    assert_eq!(r["bad_prompts_sent"], 3, "{r}");
    assert!(
        stderr.contains("prompt of 1048576 bytes is longer than"),
        "{stderr}"
    );
    assert!(r["bad_sent"].as_u64().unwrap() >= 20, "{r}");
    // The ROS thread survived them: commands kept coming (200 Hz) and kept moving the arm.
    let after = r["commands_after_bad"].as_u64().unwrap();
    assert!(
        after >= 100,
        "{after} commands after the bad frames: {r}\n{stderr}"
    );
    let moved = r["moved_after_bad"].as_f64().unwrap();
    assert!(moved > 0.001, "arm did not move after the bad frames: {r}");
    assert_eq!(x.summary["limit_violations"], 0);
    // Each refusal is named, with its topic; the good prompt stays.
    for needle in [
        "/camera/image_raw",
        "empty image",
        "step",
        "/wrist/image_raw/compressed",
        "/pi0d/prompt",
        "control character",
    ] {
        assert!(stderr.contains(needle), "`{needle}` not in:\n{stderr}");
    }
    // The sender's text reached the log as data: the taken prompt's right-to-left override
    // shown escaped, the refused prompt's escape sequence not at all; neither as itself.
    assert!(stderr.contains("prompt=\\u{202e}gnp.exe"), "{stderr}");
    for raw in ["\x1b[2J", "\u{202e}"] {
        assert!(!stderr.contains(raw), "{raw:?} reached the log:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn when_dry_run_expect_nothing_on_the_robot_topic_and_the_full_stream_on_the_shadow() {
    let domain = 20 + ((std::process::id() + 101) % 150) as u16;
    let cfg = ros_config(domain);
    let x = exchange_with(
        "ros-dry-run",
        &cfg,
        domain,
        &["--duration", "8"],
        4.0,
        &["--dry-run"],
    );
    let (s, r) = (&x.summary, &x.report);
    assert_eq!(r["commands"], 0, "the robot's topic got commands: {r}");
    // 200 Hz for ~3 s of running (discovery takes the first moments).
    assert!(r["shadow_commands"].as_u64().unwrap() >= 300, "{r}");
    assert_eq!(s["dry_run"], true);
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 2, "{s}");
    assert!(
        x.stderr
            .contains("dry run: commands go to /pi0d/dry_run/arm_controller/joint_trajectory"),
        "{}",
        x.stderr
    );
}

#[test]
fn when_joint_states_come_on_another_topic_expect_the_start_up_error_to_name_what_the_graph_has() {
    let domain = 20 + ((std::process::id() + 17) % 150) as u16;
    let cfg = ros_config(domain);
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("ros-wrong-topic");
    let peer = cyclone_peer(
        domain,
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
        stderr.contains("on /joint_states (sensor_msgs/JointState, best effort keep-last 1")
            && stderr.contains(
                "nothing arrived; JointState published on the graph: /robot/joint_states (sensor_msgs/msg/JointState, best effort)"
            ),
        "{stderr}"
    );
}
