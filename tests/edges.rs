//! The daemon's edges, through the real binary: log and output pipes that close under it,
//! signals, bad input files `check` must refuse, too few threads, the exit-code table end to
//! end, and the simulator `crash` drill for the thread supervisor. Names follow
//! `when_<situation>_expect_<behaviour>`.

mod common;

use std::io::{BufRead, Read};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::procs::*;
use common::*;
use serde_json::Value as Json;
use toml::Value;

fn sim_events(mut cfg: toml::Table, events: Vec<Value>) -> toml::Table {
    cfg["sim"]
        .as_table_mut()
        .unwrap()
        .insert("events".into(), Value::Array(events));
    cfg
}

fn event(at_s: f64, kind: &str, extra: &[(&str, Value)]) -> Value {
    let mut pairs = vec![
        ("at_s", Value::Float(at_s)),
        ("event", Value::String(kind.into())),
    ];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

fn set(cfg: &mut toml::Table, section: &str, key: &str, v: Value) {
    cfg.entry(section)
        .or_insert_with(|| Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap()
        .insert(key.into(), v);
}

/// The exit code is `code` and, where a summary was written, it says the same by name.
fn assert_exit(status: ExitStatus, summary: Option<&Json>, code: i32, name: &str, stderr: &str) {
    assert_eq!(status.code(), Some(code), "{status}; stderr:\n{stderr}");
    if let Some(s) = summary {
        assert_eq!(s["exit"], name, "{s}");
        assert_eq!(s["exit_code"], code, "{s}");
    }
}

fn no_panic(stderr: &str) {
    assert!(
        !stderr.contains("panicked"),
        "a panic reached stderr:\n{stderr}"
    );
}

/// `pi0d check --config CFG`, as written in a scratch dir.
fn check(name: &str, cfg: &toml::Table) -> (ExitStatus, String) {
    let dir = scratch_dir(name);
    let out = pi0d()
        .arg("check")
        .arg("--config")
        .arg(write_config(&dir, cfg))
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A run watched while it goes; starts once SERIAL is held by the caller.
fn start_run(name: &str, cfg: &toml::Table, duration_s: f64) -> (Watched, std::path::PathBuf) {
    let dir = scratch_dir(name);
    (Watched::start(run_command(&dir, cfg, duration_s)), dir)
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- 1. The log pipe closes mid-run ----

#[test]
fn when_stderr_pipe_closes_mid_run_expect_run_completes_and_lost_lines_counted() {
    let _serial = serial();
    let dir = scratch_dir("stderr-closed");
    let (mut read_end, write_end) = pipe();
    // Not --quiet: the status line keeps writing to the log.
    let mut child = pi0d()
        .args(["run", "--duration", "4", "--config"])
        .arg(write_config(&dir, &sim_config()))
        .arg("--summary")
        .arg(dir.join("summary.json"))
        .stdout(Stdio::null())
        .stderr(write_end)
        .spawn()
        .unwrap();
    // Read the log for about a second once the arm runs (status lines included), then close it.
    set_nonblocking(&read_end);
    let mut seen = String::new();
    let started = Instant::now();
    let mut running_since = None;
    while running_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(1)) {
        assert!(started.elapsed() < Duration::from_secs(20), "{seen}");
        let mut buf = [0u8; 4096];
        match read_end.read(&mut buf) {
            Ok(n @ 1..) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
        if running_since.is_none() && seen.contains("start gate passed") {
            running_since = Some(Instant::now());
        }
    }
    drop(read_end);
    let status = wait_for_exit(&mut child, 30.0);
    let s = summary_in(&dir).expect("a summary despite the closed log");
    assert_exit(status, Some(&s), 0, "clean", &seen);
    assert!(s["log_lines_lost"].as_u64().unwrap() > 0, "{s}");
    assert!(s["duration_s"].as_f64().unwrap() >= 3.9, "{s}");
}

#[test]
fn when_stderr_is_dev_full_expect_run_completes_and_lost_lines_counted() {
    let _serial = serial();
    let dir = scratch_dir("stderr-full");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let status = run_command(&dir, &sim_config(), 2.0)
        .stdout(Stdio::null())
        .stderr(full)
        .status()
        .unwrap();
    let s = summary_in(&dir).expect("a summary despite a full stderr");
    assert_exit(status, Some(&s), 0, "clean", "(stderr was /dev/full)");
    assert!(s["log_lines_lost"].as_u64().unwrap() > 0, "{s}");
}

// ---- 2. Closed stdout ----

#[test]
fn when_stdout_closes_after_first_line_expect_check_exit_0_without_panic() {
    let _serial = serial();
    let cfg = root().join("config/sim.toml");
    // Like `| head -1`: one line read, then the pipe closed.
    let mut child = pi0d()
        .args(["check", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("config: "), "{first}");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    no_panic(&stderr);
    // Closed before the first line: every write fails, check still validates everything.
    let (read_end, write_end) = pipe();
    drop(read_end);
    let out = pi0d()
        .args(["check", "--config"])
        .arg(&cfg)
        .stdout(write_end)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    no_panic(&stderr);
}

// ---- 3. Signals ----

#[test]
fn when_hup_usr1_usr2_arrive_expect_them_logged_ignored_and_run_to_duration() {
    let _serial = serial();
    let (mut run, dir) = start_run("ignored-signals", &sim_config(), 4.0);
    run.wait_for_log("to=running", 20.0);
    // Ctrl-Z's SIGTSTP must not suspend it mid-motion either.
    for sig in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGTSTP] {
        send_signal(&run.child, sig);
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, stderr) = run.finish(30.0);
    let s = summary_in(&dir).expect("summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(s["signals_ignored"].as_u64().unwrap() >= 4, "{s}");
    assert!(
        s["duration_s"].as_f64().unwrap() >= 3.9,
        "ran to its duration: {s}"
    );
    for name in ["SIGHUP", "SIGUSR1", "SIGUSR2", "SIGTSTP"] {
        assert!(stderr.contains(name), "{name} not logged:\n{stderr}");
    }
    assert!(stderr.contains("configuration reload is not supported"));
}

#[test]
fn when_whole_process_suspended_expect_no_thread_blamed_and_clean_exit() {
    let _serial = serial();
    let (mut run, dir) = start_run("suspended", &sim_config(), 5.0);
    run.wait_for_log("to=running", 20.0);
    send_signal(&run.child, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    send_signal(&run.child, libc::SIGCONT);
    let (status, stderr) = run.finish(30.0);
    let s = summary_in(&dir).expect("summary");
    // Every thread stood still together: that is a suspension, not a thread fault.
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(stderr.contains("was suspended for"), "{stderr}");
    assert_eq!(s["limit_violations"], 0, "{s}");
}

#[test]
fn when_sigterm_or_sigquit_once_expect_controlled_stop_exit_0_with_summary() {
    let _serial = serial();
    for (sig, name) in [(libc::SIGTERM, "sigterm"), (libc::SIGQUIT, "sigquit")] {
        let (mut run, dir) = start_run(name, &sim_config(), 60.0);
        run.wait_for_log("to=running", 20.0);
        let sent = Instant::now();
        send_signal(&run.child, sig);
        let (status, stderr) = run.finish(15.0);
        let s = summary_in(&dir).unwrap_or_else(|| panic!("{name}: no summary:\n{stderr}"));
        assert_exit(status, Some(&s), 0, "clean", &stderr);
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "{name}: slow stop"
        );
        assert!(
            stderr.contains("stopping: decelerating to rest"),
            "{stderr}"
        );
        assert_eq!(s["final_mode"], "stopping", "{name}: {s}");
        assert_eq!(s["limit_violations"], 0);
    }
}

#[test]
fn when_second_sigterm_arrives_while_stopping_expect_exit_130_at_once() {
    let _serial = serial();
    let (mut run, dir) = start_run("two-sigterms", &sim_config(), 60.0);
    run.wait_for_log("to=running", 20.0);
    send_signal(&run.child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(5));
    send_signal(&run.child, libc::SIGTERM);
    let (status, stderr) = run.finish(10.0);
    assert_exit(status, None, 130, "interrupted", &stderr);
    assert!(summary_in(&dir).is_none(), "exited at once, no summary");
}

// ---- 4. Bad inputs refused by `check` ----

#[test]
fn when_normalizer_stats_shorter_than_model_expect_check_exit_1_naming_file_and_stat() {
    let dir = scratch_dir("short-stats");
    let ck = dir.join("tiny-pi0");
    std::fs::create_dir(&ck).unwrap();
    for f in std::fs::read_dir(root().join("models/tiny-pi0")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), ck.join(f.file_name())).unwrap();
    }
    let pre: Json = serde_json::from_str(
        &std::fs::read_to_string(ck.join("policy_preprocessor.json")).unwrap(),
    )
    .unwrap();
    let stats = pre["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|s| s["state_file"].as_str())
        .expect("the normalizer's state_file");
    truncate_f32_tensor(&ck.join(stats), "observation.state.mean", 5);
    let mut cfg = sim_model_config();
    cfg["policy"]["checkpoint"] = Value::String(ck.display().to_string());
    let _serial = serial();
    let (status, stderr) = check("short-stats-check", &cfg);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&ck.join(stats).display().to_string())
            && stderr.contains("`observation.state.mean`")
            && stderr.contains("5 values, expected 7"),
        "{stderr}"
    );
    no_panic(&stderr);
}

/// `check` on the sim config with its URDF replaced by `edit(urdf text)`.
fn check_urdf(name: &str, edit: impl Fn(&str) -> String) -> (ExitStatus, String, String) {
    let dir = scratch_dir(name);
    let text = std::fs::read_to_string(root().join("urdf/sim_arm.urdf")).unwrap();
    let urdf = dir.join("arm.urdf");
    let edited = edit(&text);
    assert_ne!(edited, text, "the edit changed nothing");
    std::fs::write(&urdf, edited).unwrap();
    let mut cfg = sim_config();
    cfg["robot"]["urdf"] = Value::String(urdf.display().to_string());
    let (status, stderr) = check(&format!("{name}-check"), &cfg);
    (status, stderr, urdf.display().to_string())
}

#[test]
fn when_urdf_defines_a_joint_twice_expect_check_exit_1_naming_file_and_joint() {
    let (status, stderr, urdf) = check_urdf("dup-joint", |t| {
        let i = t.find("  <joint name=\"elbow\"").unwrap();
        let j = i + t[i..].find("</joint>\n").unwrap() + "</joint>\n".len();
        format!("{}{}{}", &t[..j], &t[i..j], &t[j..])
    });
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&urdf) && stderr.contains("joint `elbow`") && stderr.contains("twice"),
        "{stderr}"
    );
}

#[test]
fn when_urdf_origin_is_nan_expect_check_exit_1_naming_file_and_joint() {
    let (status, stderr, urdf) = check_urdf("nan-origin", |t| {
        t.replace(
            "<origin xyz=\"0 0 0.25\" rpy=\"0 0 0\"/>",
            "<origin xyz=\"0 0 NaN\" rpy=\"0 0 0\"/>",
        )
    });
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&urdf) && stderr.contains("joint `elbow`") && stderr.contains("NaN"),
        "{stderr}"
    );
}

#[test]
fn when_measurement_delay_exceeds_joint_state_timeout_expect_check_exit_1_naming_both() {
    let mut cfg = sim_config();
    cfg["sim"]["measurement_delay_s"] = Value::Float(0.2);
    let (status, stderr) = check("slow-measurement", &cfg);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("sim.measurement_delay_s")
            && stderr.contains("safety.joint_state_timeout_s"),
        "{stderr}"
    );
}

// ---- 5. Too few threads ----

#[test]
fn when_threads_limited_by_pids_cgroup_expect_exit_0_or_9_never_a_panic() {
    let dir = scratch_dir("pids");
    let cfg = write_config(&dir, &sim_model_config());
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_pi0d"));
    let run_args: Vec<std::ffi::OsString> = vec![
        "run".into(),
        "--quiet".into(),
        "--duration".into(),
        "0.5".into(),
        "--config".into(),
        cfg.clone().into(),
    ];
    let check_args: Vec<std::ffi::OsString> = vec!["check".into(), "--config".into(), cfg.into()];
    let _serial = serial();
    let mut codes = Vec::new();
    for n in 1..=16u32 {
        let name = format!("pi0d-test-{}-{n}", std::process::id());
        let group = match PidsCgroup::create(&name, n) {
            Ok(g) => g,
            Err(why) => {
                eprintln!("SKIPPED, nothing checked: no pids cgroup can be made here ({why})");
                return;
            }
        };
        for (what, args) in [("run", &run_args), ("check", &check_args)] {
            let out = group.command(bin, args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let code = out.status.code();
            let ctx = format!("{what} with pids.max = {n}: {:?}\n{stderr}", out.status);
            assert!(!stderr.contains("panicked"), "{ctx}");
            match code {
                Some(0) => {}
                Some(9) => assert!(
                    stderr.contains("cannot start") && stderr.contains("thread"),
                    "{ctx}"
                ),
                _ => panic!("exit {code:?}, expected 0 or 9: {ctx}"),
            }
            codes.push((what, n, code.unwrap()));
        }
        drop(group);
    }
    eprintln!("exit codes by pids.max: {codes:?}");
    for what in ["run", "check"] {
        let of = |n| codes.iter().find(|c| c.0 == what && c.1 == n).unwrap().2;
        assert_eq!(of(1), 9, "{what}: one task cannot run it: {codes:?}");
        assert_eq!(of(16), 0, "{what}: 16 tasks are enough: {codes:?}");
    }
}

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
        stderr.contains("no joint state received within 10.0 s"),
        "{stderr}"
    );
    let took = started.elapsed().as_secs_f64();
    assert!((9.5..25.0).contains(&took), "waited {took} s");
    no_panic(&stderr);
}

#[test]
fn when_stop_outlasts_stop_timeout_expect_exit_5_stop_timeout() {
    let mut cfg = sim_config();
    set(&mut cfg, "control", "stop_timeout_s", Value::Float(0.001));
    cfg["policy"]["frequency_hz"] = Value::Float(0.5);
    let run = run_daemon("exit-5", &cfg, 2.0);
    assert_exit(
        run.output.status,
        run.summary.as_ref(),
        5,
        "stop_timeout",
        &run.stderr,
    );
    assert!(
        run.stderr.contains("control.stop_timeout_s"),
        "{}",
        run.stderr
    );
}

/// The `crash` drill: asserts the thread fault's exit and summary, returns the run.
fn crash_run(name: &str, events: Vec<Value>) -> Run {
    let cfg = sim_events(sim_config(), events);
    let started = Instant::now();
    let run = run_daemon(name, &cfg, 8.0);
    let took = started.elapsed().as_secs_f64();
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

#[test]
fn when_camera_never_fresh_expect_exit_8_start_timeout_naming_camera_and_field() {
    let started = Instant::now();
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
    assert!(started.elapsed() < Duration::from_secs(5), "gave up at 1 s");
}

/// The summary says what held the start, not what the stopping arm waits for.
#[test]
fn when_start_times_out_on_a_camera_expect_summary_waiting_for_fresh_camera() {
    let run = run_daemon("exit-8-waiting", &camera_never_fresh(), 5.0);
    assert_eq!(run.code(), 8, "{}", run.stderr);
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

/// The binary cannot show this one: in the sim only the (dead) simulator thread delivers resets,
/// and the daemon exits once at rest. So the control loop itself: the supervisor's fault latch,
/// then a released e-stop and a reset as the sim or ROS would deliver them.
#[test]
fn when_reset_arrives_after_a_latched_thread_fault_expect_control_loop_stays_estopped() {
    use pi0d::daemon::control::{ControlEvent, ControlLoop, StepOutcome};
    use pi0d::daemon::worker::{self, WorkerSetup, WorkerStats};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut cfg = pi0d::config::Config::load(&root().join("config/sim.toml")).unwrap();
    cfg.policy.source = pi0d::config::PolicySource::Scripted {
        amplitude: 0.3,
        frequency_hz: 0.2,
    };
    let board = Arc::new(pi0d::io::Blackboard::new(cfg.sim.cameras.len(), "test"));
    let start = pi0d::time::MonoTime::now();
    // A perfect arm: it stands where it was last commanded.
    let fresh = |now: pi0d::time::MonoTime| {
        let (stamp, cmd) = board.command.load();
        let position = if stamp == pi0d::time::MonoTime::ZERO {
            cfg.sim.initial_position
        } else {
            cmd.position
        };
        board.joint_state.store(pi0d::joints::JointMeasurement {
            stamp: now,
            position,
        });
        for s in &board.camera_stamps {
            s.store(now.as_nanos(), Ordering::Relaxed);
        }
    };
    fresh(start);
    let stop = Arc::new(AtomicBool::new(false));
    let setup = WorkerSetup {
        limits: cfg.limits.clone(),
        map: cfg.policy.action_map.clone(),
        safety: cfg.safety.clone(),
        chunk_steps: cfg.policy.chunk_steps,
    };
    let policy = pi0d::policy::from_config(&cfg).unwrap();
    let stats = Arc::new(WorkerStats::default());
    let (handle, worker_thread) =
        worker::spawn(policy, setup, board.clone(), stats, stop.clone()).unwrap();
    let ctl = pi0d::control::Controller::from_config(&cfg, &board.joint_state.load(), start);
    let (tx, rx) = std::sync::mpsc::sync_channel(1024);
    let live = Arc::new(pi0d::control::stats::LiveStats::default());
    let stop_requested = Arc::new(AtomicBool::new(false));
    let mut lp = ControlLoop::new(
        ctl.unwrap(),
        handle,
        board.clone(),
        live,
        stop_requested.clone(),
        tx,
        1,
        3.0,
    );
    let mut states: Vec<String> = Vec::new();
    let mut tick = 0u64;
    let mut steps = |n: usize, until: Option<&str>, states: &mut Vec<String>| {
        for i in 0..n {
            std::thread::sleep(Duration::from_millis(2));
            tick += 1;
            let now = start.offset_seconds(tick as f64 * cfg.control.period.as_secs_f64());
            fresh(now);
            let outcome = lp.step(now);
            for e in rx.try_iter() {
                if let ControlEvent::Transition(t) = e {
                    states.push(t.to.to_string());
                }
            }
            if outcome != StepOutcome::Continue
                || until.is_some_and(|u| states.iter().any(|s| s == u)) && i > 10
            {
                return outcome;
            }
        }
        StepOutcome::Continue
    };
    steps(5_000, Some("running"), &mut states);
    assert!(states.iter().any(|s| s == "running"), "{states:?}");
    // What the supervisor does on a thread fault.
    board.fault.store(true, Ordering::SeqCst);
    steps(400, None, &mut states);
    assert_eq!(
        states.last().map(String::as_str),
        Some("estopped"),
        "{states:?}"
    );
    let before = states.len();
    board.estop.store(false, Ordering::SeqCst);
    board.resets.fetch_add(1, Ordering::SeqCst);
    steps(400, None, &mut states);
    assert!(states.len() == before, "the reset moved it on: {states:?}");
    stop_requested.store(true, Ordering::SeqCst);
    assert_eq!(
        steps(2_000, None, &mut states),
        StepOutcome::Done,
        "{states:?}"
    );
    assert_eq!(states.last().map(String::as_str), Some("estopped"));
    stop.store(true, Ordering::SeqCst);
    worker_thread.join().unwrap();
}
