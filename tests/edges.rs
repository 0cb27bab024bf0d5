//! The daemon's edges, through the real binary: log and output pipes that close under it,
//! signals, bad input files `check` must refuse, too few threads (the exit-code table and the
//! supervisor's drills are in `exit_codes.rs`). Names follow `when_<situation>_expect_<behaviour>`.

mod common;

use std::io::{BufRead, Read};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::edge::*;
use common::procs::*;
use common::*;
use serde_json::Value as Json;
use toml::Value;

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
fn when_usr1_usr2_tstp_arrive_expect_them_logged_ignored_and_run_to_duration() {
    let _serial = serial();
    let (mut run, dir) = start_run("ignored-signals", &sim_config(), 4.0);
    run.wait_for_log("to=running", 20.0);
    // Ctrl-Z's SIGTSTP must not suspend it mid-motion either.
    for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGTSTP] {
        send_signal(&run.child, sig);
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, stderr) = run.finish(30.0);
    let s = summary_in(&dir).expect("summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(s["signals_ignored"].as_u64().unwrap() >= 3, "{s}");
    assert!(
        s["duration_s"].as_f64().unwrap() >= 3.9,
        "ran to its duration: {s}"
    );
    for name in ["SIGUSR1", "SIGUSR2", "SIGTSTP"] {
        assert!(stderr.contains(name), "{name} not logged:\n{stderr}");
    }
}

/// SIGHUP reloads the file: a new prompt and tighter limits are taken (the running arm holds
/// for them and resumes), a changed rate and looser limits are refused naming the field, a
/// file that no longer loads changes nothing; the run goes on to its duration.
#[test]
fn when_sighup_arrives_expect_safe_changes_reloaded_and_the_rest_refused_by_name() {
    let _serial = serial();
    let cfg = sim_config();
    let (mut run, dir) = start_run("sighup-reload", &cfg, 6.0);
    run.wait_for_log("to=running", 20.0);
    let file = dir.join("config.toml");
    let write = |t: &toml::Table| std::fs::write(&file, toml::to_string(t).unwrap()).unwrap();
    let mut tighter = cfg.clone();
    tighter["policy"]["prompt"] = Value::String("stack the cups".into());
    tighter["limits"]["acceleration"] = Value::Float(3.0);
    tighter["control"]["rate_hz"] = Value::Integer(500);
    write(&tighter);
    send_signal(&run.child, libc::SIGHUP);
    run.wait_for_log("configuration partly reloaded", 10.0);
    run.wait_for_log("from=holding(reconfigure) to=running", 10.0);
    let mut looser = tighter.clone();
    looser["limits"]["jerk"] = Value::Float(400.0);
    write(&looser);
    send_signal(&run.child, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&file, "[robot\n").unwrap();
    send_signal(&run.child, libc::SIGHUP);
    let (status, stderr) = run.finish(30.0);
    let s = summary_in(&dir).expect("summary");
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    for line in [
        "SIGHUP: policy.prompt reloaded",
        "SIGHUP: tighter limits reloaded",
        "`control.rate_hz` not reloaded",
        "`limits.joints.elbow.jerk` not reloaded: 400 is looser than the running 150",
        "SIGHUP: the configuration does not load; nothing changed",
    ] {
        assert!(stderr.contains(line), "{line:?} not logged:\n{stderr}");
    }
    assert_eq!(s["rate_hz"], 200.0, "{s}");
    assert_eq!(s["limit_violations"], 0, "{s}");
    assert!(
        s["duration_s"].as_f64().unwrap() >= 5.9,
        "ran to its duration: {s}"
    );
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

/// A policy whose load and first inference take long (here a scripted one whose inference
/// takes 30 s): SIGTERM during the warm-up ends the start at once, with a line saying where
/// it was; nothing moved (no control loop ran), so the exit is clean.
#[test]
fn when_sigterm_comes_during_a_long_warm_up_expect_exit_0_at_once_naming_the_phase() {
    let _serial = serial();
    let mut cfg = sim_config();
    cfg["policy"]["latency_s"] = Value::Float(30.0);
    let (mut run, dir) = start_run("sigterm-warm-up", &cfg, 60.0);
    run.wait_for_log("warming up", 20.0);
    let sent = Instant::now();
    send_signal(&run.child, libc::SIGTERM);
    let (status, stderr) = run.finish(25.0);
    // Far below the warm-up's 30 s: it was not waited for.
    assert!(sent.elapsed() < Duration::from_secs(15), "{stderr}");
    let s = summary_in(&dir).unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    assert_exit(status, Some(&s), 0, "clean", &stderr);
    assert!(
        stderr.contains(
            "stop requested while running the policy's first inference (warm-up): nothing moved"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("to=running"), "{stderr}");
}

/// The run's `--duration` ends a start still warming up, as it ends one still waiting for
/// its first chunk (exit 8), with the phase named.
#[test]
fn when_the_duration_ends_during_a_long_warm_up_expect_exit_8_naming_the_phase() {
    let _serial = serial();
    let mut cfg = sim_config();
    cfg["policy"]["latency_s"] = Value::Float(30.0);
    let started = Instant::now();
    let (run, dir) = start_run("duration-warm-up", &cfg, 2.0);
    let (status, stderr) = run.finish(25.0);
    assert!(started.elapsed() < Duration::from_secs(15), "{stderr}");
    let s = summary_in(&dir).unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    assert_exit(status, Some(&s), 8, "start_timeout", &stderr);
    assert!(
        stderr.contains("the run's --duration ended while running the policy's first inference (warm-up): nothing moved"),
        "{stderr}"
    );
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
