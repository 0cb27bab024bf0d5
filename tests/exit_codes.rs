//! The exit-code table end to end through the real binary (each code the binary can reach,
//! named in the summary as in docs/safety.md), and the simulator's drills for the thread
//! supervisor. Names follow `when_<situation>_expect_<behaviour>`.

mod common;

use std::time::{Duration, Instant};

use common::edge::*;
use common::procs::*;
use common::*;
use serde_json::Value as Json;
use toml::Value;

// ---- 6. The exit-code table, end to end ----

#[test]
fn when_nominal_run_expect_exit_0_clean() {
    let run = run_daemon("exit-0", &sim_config(), 2.0);
    assert_exit(
        run.output.status,
        run.summary.as_ref(),
        0,
        "clean",
        &run.stderr,
    );
    assert_eq!(run.summary()["faults"], Json::Array(vec![]));
    assert_eq!(run.summary()["waiting_for"], Json::Null);
}

#[test]
fn when_config_field_is_bad_expect_exit_1_invalid_input_and_no_summary() {
    let mut cfg = sim_config();
    cfg["safety"]["camera_timeout_s"] = Value::Float(-1.0);
    let run = run_daemon("exit-1", &cfg, 1.0);
    assert_exit(run.output.status, None, 1, "invalid_input", &run.stderr);
    assert!(
        run.stderr.contains("`safety.camera_timeout_s`"),
        "{}",
        run.stderr
    );
    assert!(run.summary.is_none());
}

#[test]
fn when_summary_path_cannot_be_written_expect_exit_1_before_the_arm_moves() {
    let dir = scratch_dir("summary-unwritable");
    let cfg = write_config(&dir, &sim_config());
    for bad in [dir.join("no/such/dir/summary.json"), dir.to_path_buf()] {
        let started = Instant::now();
        let out = pi0d()
            .args(["run", "--quiet", "--duration", "30", "--config"])
            .arg(&cfg)
            .arg("--summary")
            .arg(&bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_exit(out.status, None, 1, "invalid_input", &stderr);
        assert!(stderr.contains("--summary"), "{stderr}");
        // Refused at start, not after a 30 s run.
        assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
        assert!(!stderr.contains("start gate passed"), "{stderr}");
    }
}

#[test]
fn when_command_line_is_malformed_expect_exit_2_usage() {
    let dir = scratch_dir("exit-2");
    let cfg = write_config(&dir, &sim_config());
    let cfg = cfg.to_str().unwrap();
    let out = dir.join("out");
    let out = out.to_str().unwrap();
    let ck = root().join("models/tiny-pi0");
    let ck = ck.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["run", "--config", cfg, "--duration", "nan"], "--duration"),
        (&["run", "--duration", "1"], "--config"),
        (
            &[
                "export",
                "--checkpoint",
                ck,
                "--cameras",
                "1",
                "--out",
                out,
                "--dtype",
                "f64",
            ],
            "f64",
        ),
        (&["infer", "--inputs", cfg, "--output", out], "--checkpoint"),
    ];
    for (args, named) in cases {
        let o = pi0d().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} should name {named}: {stderr}"
        );
        no_panic(&stderr);
    }
    assert!(!dir.join("out").exists());
}

#[test]
fn when_arm_starts_outside_limits_expect_exit_3_start_refused() {
    let mut cfg = sim_config();
    cfg["sim"]["initial_position"]["elbow"] = Value::Float(2.38);
    let run = run_daemon("exit-3", &cfg, 2.0);
    assert_exit(run.output.status, None, 3, "start_refused", &run.stderr);
    assert!(run.stderr.contains("`elbow`"), "{}", run.stderr);
}

#[test]
fn when_no_joint_state_ever_arrives_expect_exit_4_after_the_wait() {
    // A ROS arm on a domain nobody publishes in (loopback only): no joint state, ever. Not
    // timing-sensitive (it only waits), so it does not hold SERIAL.
    let mut cfg = sim_config();
    cfg["robot"]["io"] = Value::String("ros".into());
    cfg.remove("sim");
    let domain = 200 + (std::process::id() % 30) as i64;
    set(&mut cfg, "ros", "domain_id", Value::Integer(domain));
    set(&mut cfg, "ros", "loopback_only", Value::Boolean(true));
    let dir = scratch_dir("exit-4");
    let started = Instant::now();
    let out = run_command(&dir, &cfg, 30.0).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_exit(
        out.status,
        summary_in(&dir).as_ref(),
        4,
        "no_joint_state",
        &stderr,
    );
    assert!(
        stderr.contains("no joint state received within 10.0 s of start-up on /joint_states")
            && stderr.contains(&format!(
                "best effort keep-last 1, domain {domain}, loopback only"
            ))
            && stderr.contains(
                "nothing arrived, and no JointState is published on the graph (another domain"
            ),
        "{stderr}"
    );
    let took = started.elapsed().as_secs_f64();
    assert!((9.5..25.0).contains(&took), "waited {took} s");
    no_panic(&stderr);
}

/// Exit 5 (stop_timeout) is the safety net for a governor that does not brake as planned: a
/// configuration whose stop cannot finish in time is refused before the arm moves (it used to
/// run and end in exit 5 with the arm still moving).
#[test]
fn when_stop_timeout_is_shorter_than_braking_expect_exit_1_before_the_arm_moves() {
    let mut cfg = sim_config();
    set(&mut cfg, "control", "stop_timeout_s", Value::Float(0.001));
    cfg["policy"]["frequency_hz"] = Value::Float(0.5);
    let run = run_daemon("exit-5", &cfg, 2.0);
    assert_eq!(run.code(), 1, "{}", run.stderr);
    assert!(run.summary.is_none(), "the arm never ran");
    assert!(
        run.stderr
            .contains("`control.stop_timeout_s`: expected 0.01..600 s, found 0.001"),
        "{}",
        run.stderr
    );
    set(&mut cfg, "control", "stop_timeout_s", Value::Float(0.5));
    let run = run_daemon("exit-5", &cfg, 2.0);
    assert_eq!(run.code(), 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("`control.stop_timeout_s`: 0.5 s is too short for a stop to finish"),
        "{}",
        run.stderr
    );
}

/// The `crash` drill: asserts the thread fault's exit and summary, returns the run.
fn crash_run(name: &str, events: Vec<Value>) -> Run {
    let cfg = sim_events(sim_config(), events);
    let run = run_daemon(name, &cfg, 8.0);
    let took = run.elapsed_s;
    assert_exit(
        run.output.status,
        run.summary.as_ref(),
        7,
        "thread_fault",
        &run.stderr,
    );
    let s = run.summary();
    let faults: Vec<&str> = s["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(
        faults,
        ["simulator thread panicked: sim event `crash` at 1 s (drill)"],
        "{s}"
    );
    assert_eq!(s["final_mode"], "estopped", "{s}");
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert!(
        run.stderr.contains("e-stop latched, decelerating to rest"),
        "{}",
        run.stderr
    );
    assert_eq!(run.states().last().unwrap(), "estopped", "{}", run.stderr);
    // Decelerated and gone long before --duration (8 s): within a few seconds of the crash.
    assert!(took < 7.0, "took {took} s");
    run
}

#[test]
fn when_sim_thread_crashes_expect_estop_decelerate_and_exit_7_thread_fault() {
    let run = crash_run("exit-7", vec![event(1.0, "crash", &[])]);
    let estopped = run.time_of("estopped", 0.0).unwrap();
    assert!((0.8..2.0).contains(&estopped), "e-stopped at {estopped} s");
    assert!(run.stderr.contains("thread=\"pi0d-sim\""), "{}", run.stderr);
}

#[test]
fn when_reset_follows_sim_crash_expect_still_estopped_and_exit_7() {
    // The reset at 2 s is never delivered: the simulator thread that plays the events is dead,
    // and the daemon is gone once at rest. What this pins is the outcome; the control loop's
    // refusal itself is pinned by the loop-level test below.
    let events = vec![event(1.0, "crash", &[]), event(2.0, "reset", &[])];
    let run = crash_run("crash-reset", events);
    let states = run.states();
    let estopped = states.iter().position(|s| s == "estopped").unwrap();
    assert_eq!(
        estopped,
        states.len() - 1,
        "moved on after the e-stop: {states:?}"
    );
    assert_eq!(run.event("reset"), 0, "{}", run.summary());
}

/// One run shows both: the exit (8, its message naming the camera and the field, given up at the
/// timeout) and that the summary says what held the start, not what the stopping arm waits for.
#[test]
fn when_camera_never_fresh_expect_exit_8_start_timeout_naming_camera_and_summary_waiting_for_it() {
    let run = run_daemon("exit-8", &camera_never_fresh(), 5.0);
    assert_exit(
        run.output.status,
        run.summary.as_ref(),
        8,
        "start_timeout",
        &run.stderr,
    );
    assert!(
        run.stderr.contains("control.start_timeout_s = 1 s")
            && run.stderr.contains("camera 0 (`front`)"),
        "{}",
        run.stderr
    );
    // The run's own length (the test's clock would include waiting for the other scenarios).
    assert!(
        run.elapsed_s < 5.0,
        "gave up after {} s, not at 1 s",
        run.elapsed_s
    );
    assert_eq!(
        run.summary()["waiting_for"],
        "fresh_camera",
        "{}",
        run.summary()
    );
}

/// The sim camera stalled from t=0 for longer than the run; start timeout 1 s.
fn camera_never_fresh() -> toml::Table {
    let stall = event(
        0.0,
        "stall_camera",
        &[
            ("camera", Value::String("front".into())),
            ("duration_s", Value::Float(60.0)),
        ],
    );
    let mut cfg = sim_events(sim_config(), vec![stall]);
    set(&mut cfg, "control", "start_timeout_s", Value::Float(1.0));
    cfg
}

#[test]
fn when_infer_yields_non_finite_actions_expect_exit_9_runtime_failure() {
    // An action projection so large that every step overflows.
    let ck = edited_checkpoint("exit-9", |t| {
        let w = t
            .iter_mut()
            .find(|x| x.0 == "model.action_out_proj.weight")
            .unwrap();
        for v in w.3.chunks_exact_mut(4) {
            v.copy_from_slice(&f32::MAX.to_le_bytes());
        }
    });
    let out = ck.join("actions.safetensors");
    let _serial = serial();
    let o = pi0d()
        .args(["infer", "--threads", "1", "--checkpoint"])
        .arg(&ck)
        .arg("--inputs")
        .arg(root().join("tests/fixtures/cases/pi0_f32_1cam_short/inputs.safetensors"))
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_exit(o.status, None, 9, "runtime_failure", &stderr);
    assert!(stderr.contains("non-finite action"), "{stderr}");
    assert!(!out.exists(), "no actions written");
    no_panic(&stderr);
    let _ = std::fs::remove_dir_all(ck);
}

#[test]
fn when_crash_event_has_duration_or_camera_expect_check_warns_them_ignored() {
    let crash = event(
        1.0,
        "crash",
        &[
            ("duration_s", Value::Float(1.0)),
            ("camera", Value::String("front".into())),
        ],
    );
    let dir = scratch_dir("crash-fields");
    let cfg = write_config(&dir, &sim_events(sim_config(), vec![crash]));
    let out = pi0d()
        .arg("check")
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for field in ["`sim.events[0].duration_s`", "`sim.events[0].camera`"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("warning: ") && l.contains(field) && l.contains("ignored")),
            "{field} not warned about:\n{stdout}"
        );
    }
}

/// The control drills: the control thread panics, or stops ticking; nothing else can command
/// the arm, so the run ends at once with its own code (no controlled stop is possible).
#[test]
fn when_control_thread_panics_or_stalls_expect_exit_6_control_fault_at_once() {
    for (name, ev, fault) in [
        (
            "crash-control",
            event(1.0, "crash_control", &[]),
            "control thread panicked: sim event `crash_control` (drill)",
        ),
        (
            "stall-control",
            event(1.0, "stall_control", &[("duration_s", Value::Float(30.0))]),
            "control thread stopped ticking",
        ),
    ] {
        let cfg = sim_events(sim_config(), vec![ev]);
        let run = run_daemon(name, &cfg, 10.0);
        assert_exit(
            run.output.status,
            run.summary.as_ref(),
            6,
            "control_fault",
            &run.stderr,
        );
        let s = run.summary();
        let faults = s["faults"].as_array().unwrap();
        assert!(
            faults
                .iter()
                .any(|f| f.as_str().unwrap().starts_with(fault)),
            "{s}"
        );
        // Within a few seconds of the drill, not at --duration (or at the stall's end).
        let took = run.elapsed_s;
        assert!(took < 7.0, "{name} took {took} s");
    }
}

/// The independent monitor acts: a governor fault (the drill makes one command jump) is
/// refused before it is commanded, the arm brakes to rest from the last good command, and the
/// run ends at once with its own code.
#[test]
fn when_governor_makes_a_command_jump_expect_exit_10_limit_violation_after_a_controlled_stop() {
    let mut cfg = sim_config();
    add_drill(&mut cfg, "governor_fault", 1.5, None);
    let run = run_daemon("exit-10", &cfg, 10.0);
    assert_exit(
        run.output.status,
        run.summary.as_ref(),
        10,
        "limit_violation",
        &run.stderr,
    );
    let s = run.summary();
    assert_eq!(s["limit_violations"], 1, "only the refused command: {s}");
    assert_eq!(s["safety_events"]["limit_violation"], 1, "{s}");
    assert!(
        run.states().iter().any(|m| m == "holding(limit_violation)"),
        "{:?}",
        run.states()
    );
    // The arm came to rest: the stop was a controlled one, long before --duration.
    assert_eq!(s["final_mode"], "stopping", "{s}");
    assert!(run.elapsed_s < 8.0, "took {} s", run.elapsed_s);
    assert!(
        run.stderr.contains("independent monitor refused a command"),
        "{}",
        run.stderr
    );
}

/// The fault latch (`--state-dir`): after a control fault the next start stays e-stopped and
/// runs no chunk until a reset; a run that ends without one keeps the latch; after a reset the
/// arm runs and the run after that starts normally.
#[test]
fn when_a_run_ends_with_a_fault_expect_the_next_to_wait_for_a_reset() {
    let dir = scratch_dir("fault-latch-state");
    let _ = std::fs::remove_dir_all(&dir);
    let state = dir.display().to_string();
    let args = ["--quiet", "--state-dir", state.as_str()];
    let crash = sim_events(sim_config(), vec![event(0.8, "crash_control", &[])]);
    let run = run_daemon_with("latch-crash", &crash, 5.0, &args);
    assert_eq!(run.code(), 6, "{}", run.stderr);

    let latched = run_daemon_with("latch-held", &sim_config(), 2.0, &args);
    assert_eq!(latched.code(), 0, "{}", latched.stderr);
    let s = latched.summary();
    assert_eq!(s["fault_latch"], "control_fault", "{s}");
    assert_eq!(s["chunks_accepted"], 0, "{s}");
    assert!(!latched.states().contains(&"running".to_string()), "{s}");
    assert!(latched.stderr.contains("fault latch"), "{}", latched.stderr);

    let reset = sim_events(sim_config(), vec![event(0.5, "reset", &[])]);
    let resumed = run_daemon_with("latch-reset", &reset, 3.0, &args);
    let s = resumed.summary();
    assert_eq!(s["fault_latch"], "control_fault", "{s}");
    assert!(resumed.states().contains(&"running".to_string()), "{s}");
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 1, "{s}");

    let fresh = run_daemon_with("latch-fresh", &sim_config(), 1.5, &args);
    let s = fresh.summary();
    assert!(s["fault_latch"].is_null(), "{s}");
    assert_eq!(fresh.states()[..2], ["starting", "running"], "{s}");
}
