//! A first run on a real arm, through the real binary on the simulator: limits scaled down by
//! one setting (shown by `check`, the status line and the summary, and kept by every command),
//! and a dry run that says so in every status line and leaves the arm where it is.

use crate::common;

use common::*;
use toml::Value;

/// The status lines of a run's log (at least two of them).
fn status_lines(stderr: &str) -> Vec<&str> {
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(" Hz | ")).collect();
    assert!(lines.len() >= 2, "{stderr}");
    lines
}

fn scaled(scale: f64) -> toml::Table {
    let mut cfg = sim_config();
    cfg["limits"]
        .as_table_mut()
        .unwrap()
        .insert("scale".into(), Value::Float(scale));
    cfg
}

#[test]
fn when_limits_scaled_down_expect_every_command_within_the_scaled_limits() {
    let full = sim_config();
    let cfg = scaled(0.25);
    let run = run_daemon_with("first-run-scaled", &cfg, 4.0, &[]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let s = run.summary();
    assert_eq!(s["limits_scale"], 0.25, "{s}");
    assert_eq!(s["limit_violations"], 0, "{s}");
    // The configured jerk and acceleration, scaled: what the monitor saw stays below them.
    let jerk = full["limits"]["jerk"].as_float().unwrap() * 0.25;
    let acc = full["limits"]["acceleration"].as_float().unwrap() * 0.25;
    for (joint, j) in s["max_abs_jerk"].as_object().unwrap() {
        if joint == "gripper" {
            continue; // its own (lower) limits in config/sim.toml
        }
        assert!(
            j.as_f64().unwrap() <= jerk * 1.001,
            "{joint}: jerk {j} > {jerk}"
        );
        let a = s["max_abs_acceleration"][joint].as_f64().unwrap();
        assert!(a <= acc * 1.001, "{joint}: acceleration {a} > {acc}");
    }
    // Every status line says the limits are scaled.
    let lines = status_lines(&run.stderr);
    assert!(
        lines.iter().all(|l| l.contains("limits x0.25")),
        "{lines:?}"
    );
}

#[test]
fn when_limits_scaled_down_expect_check_to_show_the_scaled_table() {
    let (code, text) = check_config("first-run-check", &scaled(0.5));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("scaled to 0.5 of every velocity"), "{text}");
    // The elbow's acceleration (6 rad/s² in config/sim.toml) appears halved.
    let elbow = text
        .lines()
        .find(|l| l.starts_with("elbow "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(elbow.contains(" 3.00 "), "{elbow}");
}

#[test]
fn when_limits_scale_is_out_of_range_expect_refused_naming_it() {
    for bad in [0.0, 1.5, -0.2] {
        let (code, text) = check_config("first-run-bad-scale", &scaled(bad));
        assert_eq!(code, Some(1), "{bad}: {text}");
        assert!(text.contains("`limits.scale`"), "{bad}: {text}");
    }
}

#[test]
fn when_dry_run_on_the_sim_expect_it_said_in_every_status_line_and_in_the_summary() {
    let cfg = sim_config();
    let run = run_daemon_with("first-run-dry", &cfg, 3.0, &["--dry-run"]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let s = run.summary();
    assert_eq!(s["dry_run"], true, "{s}");
    // The model, executor and governor all ran: chunks were executed.
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 2, "{s}");
    let lines = status_lines(&run.stderr);
    assert!(lines.iter().all(|l| l.contains("DRY RUN")), "{lines:?}");
}
