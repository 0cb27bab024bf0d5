//! The hardware-in-the-loop plumbing shared by tests/hil.rs (fault scenarios) and
//! tests/hil_task.rs (the closed-loop task): the MuJoCo robot (tests/hil/robot.py) over real
//! Cyclone DDS, and the real `pi0d` binary on a config/hil*.toml.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use toml::Value;

use super::{cyclone_python, root};

/// `config/<file>` ready to run from a scratch directory: the URDF and checkpoint paths made
/// absolute (they are relative to config/), on DDS domain `domain`.
pub fn hil_config_from(file: &str, domain: u16) -> toml::Table {
    let path = root().join("config").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut t: toml::Table = text.parse().unwrap();
    for (section, key) in [("robot", "urdf"), ("policy", "checkpoint")] {
        let rel = t[section][key].as_str().unwrap().to_string();
        let abs = root().join("config").join(rel);
        t[section][key] = Value::String(abs.display().to_string());
    }
    t["ros"]
        .as_table_mut()
        .unwrap()
        .insert("domain_id".into(), Value::Integer(domain as i64));
    t
}

/// config/hil.toml (the bundled tiny pi0) on `domain`.
pub fn hil_config(domain: u16) -> toml::Table {
    hil_config_from("hil.toml", domain)
}

/// A DDS domain of this test process's own (`offset` tells a binary's scenarios apart).
pub fn domain(offset: u32) -> u16 {
    30 + ((std::process::id() + offset) % 150) as u16
}

/// Starts the robot and waits (up to 20 s) until its joint states flow and its camera has
/// sent a frame, so that a scenario's timing does not include the robot's own start-up.
pub fn robot(domain: u16, dir: &Path, duration_s: f64, args: &[&str]) -> Child {
    let ready = dir.join("robot.ready");
    let _ = std::fs::remove_file(&ready);
    let mut child = spawn_robot(domain, dir, duration_s, args, &ready);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the robot exited during start-up: {status}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the robot was not ready within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Waits until the robot's arm setpoint first moved (the robot was started with
/// `--moving-file dir/robot.moving`): pi0d is running and commanding. Fails the test past
/// `deadline_s` (derive it from the configuration), or when pi0d or the robot ended first.
pub fn wait_until_moving(dir: &Path, run: &mut Child, robot: &mut Child, deadline_s: f64) {
    let moving = dir.join("robot.moving");
    let started = std::time::Instant::now();
    while !moving.exists() {
        if let Ok(Some(status)) = run.try_wait() {
            panic!("pi0d ended ({status}) before the arm moved");
        }
        if let Ok(Some(status)) = robot.try_wait() {
            panic!("the robot ended ({status}) before the arm moved");
        }
        let waited = started.elapsed().as_secs_f64();
        assert!(
            waited < deadline_s,
            "the arm did not move within {deadline_s} s of pi0d's start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn spawn_robot(domain: u16, dir: &Path, duration_s: f64, args: &[&str], ready: &Path) -> Child {
    cyclone_python("tests/hil/robot.py", domain)
        .arg("--duration")
        .arg(duration_s.to_string())
        .arg("--report")
        .arg(dir.join("robot.json"))
        .arg("--ready-file")
        .arg(ready)
        .arg("--moving-file")
        .arg(dir.join("robot.moving"))
        .args(args)
        .env("MUJOCO_GL", "egl")
        .stdout(Stdio::null())
        .spawn()
        .expect("the MuJoCo robot starts")
}

/// `pi0d run` on `cfg` (written to `dir`) for `duration_s`, its summary in `dir`.
pub fn pi0d(dir: &Path, cfg: &toml::Table, duration_s: f64) -> Child {
    pi0d_with_env(dir, cfg, duration_s, &[])
}

/// As `pi0d`, with `env` added to its environment.
pub fn pi0d_with_env(
    dir: &Path,
    cfg: &toml::Table,
    duration_s: f64,
    env: &[(&str, String)],
) -> Child {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(cfg).unwrap()).unwrap();
    // PI0D_BIN: the suite against another build of pi0d (release, or the one installed on a board).
    let bin = std::env::var_os("PI0D_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_pi0d").into(),
        std::path::PathBuf::from,
    );
    Command::new(bin)
        .args([
            "run",
            "--quiet",
            "--duration",
            &duration_s.to_string(),
            "--config",
        ])
        .arg(&path)
        .arg("--summary")
        .arg(dir.join("summary.json"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pi0d starts")
}

/// The robot's report, once it has exited well.
pub fn report(dir: &Path, mut robot: Child) -> serde_json::Value {
    assert!(robot.wait().unwrap().success(), "the robot failed");
    serde_json::from_str(&std::fs::read_to_string(dir.join("robot.json")).unwrap()).unwrap()
}

/// pi0d's `--summary`.
pub fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// SIGTERM, as systemd stops a service: pi0d decelerates, holds and exits 0.
pub fn stop(run: &Child) {
    // SAFETY: a signal to a child this test started.
    unsafe { libc::kill(run.id() as libc::pid_t, libc::SIGTERM) };
}

/// The largest of a report's per-joint figures.
pub fn max_over_joints(v: &serde_json::Value) -> f64 {
    v.as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .fold(0.0, f64::max)
}

/// The controller model's bound on the setpoint jerk: twenty times config/hil.toml's jerk
/// limit (150 rad/s^3), for the controller's splines between pi0d's points on 2 ms differences.
const SETPOINT_JERK_BOUND: f64 = 20.0 * 150.0;

/// What every run checks at the robot: its rate held, commands came, nothing non-finite, no
/// joint past its limits, and the setpoint jerk the robot's controller makes of pi0d's points
/// on pi0d's own timeline (tests/hil/robot.py `setpoint_jerk_on_ticks`: every trajectory it
/// took, installed at its tick from the times and values pi0d wrote) within the controller
/// model's bound. The jerk of the setpoints the robot executed in real time also carries its
/// own loop's, DDS's and the host's delays: printed, as the figure it is.
pub fn assert_robot_sane(r: &serde_json::Value) {
    let rate = r["joint_state_rate_hz"].as_f64().unwrap();
    assert!(rate > 200.0, "the robot published at {rate} Hz");
    assert!(r["commands"].as_u64().unwrap() > 50, "{}", r["commands"]);
    assert_eq!(r["nonfinite_commands"], 0);
    let over = max_over_joints(&r["over_limit"]);
    assert!(
        over <= 1e-3,
        "a joint went {over} past its limit: {}",
        r["over_limit"]
    );
    // Every arm trajectory the robot took was judged (none left out for its joint names).
    let written = r["written_commands"].as_u64().unwrap();
    assert!(written > 50, "{written} arm trajectories taken");
    assert_eq!(r["judged_on_ticks"], written, "arm trajectories judged");
    let jerk = max_over_joints(&r["max_setpoint_jerk_on_ticks"]);
    assert!(
        jerk < SETPOINT_JERK_BOUND,
        "setpoint jerk {jerk} on pi0d's timeline: {}",
        r["max_setpoint_jerk_on_ticks"]
    );
    println!(
        "robot: setpoint jerk max {jerk:.0} on pi0d's timeline, {:.0} as executed in real time (its loop up to {:.1} ms late, {} late steps; trajectories {} ms apart at the worst)",
        max_over_joints(&r["max_setpoint_jerk"]),
        r["max_late_ms"].as_f64().unwrap_or(f64::NAN),
        r["late_steps"],
        r["command_gap_at_worst_jerk_ms"]
    );
}

// Reactions judged on pi0d's own stamps against bounds from the configuration.

/// The longest stop the governor may take from what pi0d commanded: per joint, from its largest
/// commanded speed (pi0d's summary) under its configured acceleration `a` and jerk `j`, the
/// jerk-limited bound v/a + 2a/j (ramping out an opposing acceleration, braking, ramping in).
pub fn braking_bound_s(cfg: &toml::Table, summary: &serde_json::Value) -> f64 {
    let limits = &cfg["limits"];
    let of = |joint: &str, key: &str| {
        limits
            .get("joints")
            .and_then(|j| j.get(joint))
            .and_then(|j| j.get(key))
            .or_else(|| limits.get(key))
            .and_then(|v| v.as_float())
            .unwrap_or_else(|| panic!("limits.{key} for {joint}"))
    };
    summary["max_abs_velocity"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(joint, v)| {
            let (a, j) = (of(joint, "acceleration"), of(joint, "jerk"));
            v.as_f64().unwrap() / a + 2.0 * a / j
        })
        .fold(0.0, f64::max)
}

/// `control.rate_hz`'s period (s).
pub fn control_period_s(cfg: &toml::Table) -> f64 {
    1.0 / cfg["control"]["rate_hz"]
        .as_float()
        .or_else(|| cfg["control"]["rate_hz"].as_integer().map(|r| r as f64))
        .expect("control.rate_hz")
}

/// pi0d's own stamp of its first arm command at rest after `after` (wall s): the first
/// trajectory it wrote from which every one it wrote for `span_s` after stays within 1e-4 rad
/// of it (the DDS source timestamps the robot received, so the robot's loop does not shift it).
pub fn rest_written_at(report: &serde_json::Value, after: f64, span_s: f64) -> Option<f64> {
    let writes: Vec<(f64, Vec<f64>)> = report["arm_writes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let q = w[1].as_array().unwrap();
            (
                w[0].as_f64().unwrap(),
                q.iter().map(|x| x.as_f64().unwrap()).collect(),
            )
        })
        .filter(|(t, _)| *t >= after)
        .collect();
    (0..writes.len()).find_map(|i| {
        let (t0, q0) = &writes[i];
        let window: Vec<_> = writes[i..]
            .iter()
            .take_while(|(t, _)| *t < t0 + span_s)
            .collect();
        let still = window
            .iter()
            .all(|(_, q)| q.iter().zip(q0).all(|(a, b)| (a - b).abs() < 1e-4));
        // The window must reach its end (pi0d wrote past it), or rest is unproven.
        let covered = writes[i..].iter().any(|(t, _)| *t >= t0 + span_s);
        (still && covered).then_some(*t0)
    })
}

/// The allowance, beyond what the configuration sets, for an event to travel between the two
/// processes over loopback DDS and be scheduled: the robot driver's own watchdog (a command
/// path slower than that trips the driver anyway).
pub fn transit_allowance_s(report: &serde_json::Value) -> f64 {
    report["watchdog_s"].as_f64().unwrap()
}

/// The robot's watchdog hold number `index` (of `watchdog_holds`) was its watchdog's doing: on
/// the robot loop's own step clock it came the configured watchdog after the last command
/// arrived (one physics step of resolution, and one of rounding). Returns pi0d's write stamp of
/// that last command.
pub fn assert_held_by_the_watchdog(report: &serde_json::Value, index: usize) -> f64 {
    let cause = &report["watchdog_hold_causes"][index];
    let after = cause["after_last_command_s"].as_f64().unwrap();
    let wd = report["watchdog_s"].as_f64().unwrap();
    let dt = report["physics_dt_s"].as_f64().unwrap();
    assert!(
        after > wd && after <= wd + 2.0 * dt,
        "the robot held {after:.4} s after the last command; its watchdog is {wd} s: {cause}"
    );
    cause["last_write"]
        .as_f64()
        .unwrap_or_else(|| panic!("no arm command before the hold: {cause}"))
}
