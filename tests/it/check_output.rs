//! `pi0d check` through the binary: the verdict as its last line, a missing URDF named once
//! with its configuration and field, and a remote policy server probed with the daemon's own
//! client (down: a warning naming the URL; up: its metadata against the configuration).

use std::process::Command;

use crate::common;

use common::procs::write_config;
use common::*;
use toml::Value;

/// `pi0d check --config path`: exit code, stdout, stderr.
fn check_file(path: &std::path::Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["check", "--config"])
        .arg(path)
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn last_line(s: &str) -> &str {
    s.lines().last().unwrap_or("")
}

#[test]
fn when_the_config_is_valid_expect_the_last_line_to_say_run_would_start() {
    let (code, out, err) = check_file(std::path::Path::new("config/sim.toml"));
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        last_line(&out),
        "check: config/sim.toml is valid; pi0d run --config config/sim.toml would start",
        "{out}"
    );
}

#[test]
fn when_the_urdf_is_missing_expect_the_file_field_and_path_named_once() {
    let (code, out, err) = check_file(std::path::Path::new("systemd/pi0d.toml.example"));
    assert_eq!(code, Some(1), "{out}{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.starts_with(
            "error: systemd/pi0d.toml.example: `robot.urdf`: /opt/pi0d/urdf/ur5e.urdf: "
        ),
        "{line}"
    );
    assert!(
        line.ends_with("No such file or directory (os error 2)"),
        "{line}"
    );
    assert_eq!(line.matches("(os error 2)").count(), 1, "{line}");
    assert_eq!(
        line.matches("/opt/pi0d/urdf/ur5e.urdf").count(),
        1,
        "{line}"
    );
    assert!(
        last_line(&out).starts_with("check: systemd/pi0d.toml.example is NOT valid: 1 error"),
        "{out}"
    );
}

/// A port nothing listens on: bound, then closed.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn when_the_policy_server_is_down_expect_a_warning_naming_the_url_and_exit_0() {
    let url = format!("ws://127.0.0.1:{}", closed_port());
    let cfg = remote_policy_config(
        "openpi",
        &[
            ("url", Value::String(url.clone())),
            ("connect_timeout_s", Value::Float(0.5)),
        ],
    );
    let dir = scratch_dir("check-openpi-down");
    let (code, out, err) = check_file(&write_config(&dir, &cfg));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains("openpi loaded"), "{out}");
    let warning = err
        .lines()
        .find(|l| l.starts_with("warning: policy server"))
        .unwrap_or_else(|| panic!("no warning: {err}"));
    assert!(warning.contains(&url), "{warning}");
    assert!(warning.contains("not reachable"), "{warning}");
    assert!(last_line(&out).contains("is valid with"), "{out}");
    assert!(last_line(&out).ends_with("would start"), "{out}");
}

#[test]
fn when_the_policy_server_is_up_expect_its_metadata_checked_against_the_config() {
    let model = root().join("models/tiny-pi0");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--checkpoint".as_ref(),
        model.as_os_str(),
        "--threads".as_ref(),
        "1".as_ref(),
    ];
    let (mut server, port, _log) = pi0d_serve(&args, ("PI0D_TEST_KEY", "k3y"));
    let url = format!("ws://127.0.0.1:{port}");
    let settings = |steps: i64| {
        let mut cfg = remote_policy_config(
            "openpi",
            &[
                ("url", Value::String(url.clone())),
                ("api_key", Value::String("k3y".into())),
            ],
        );
        cfg["policy"]
            .as_table_mut()
            .unwrap()
            .insert("chunk_steps".into(), Value::Integer(steps));
        cfg
    };
    let dir = scratch_dir("check-openpi-up");
    // The tiny model answers 50 steps of 7 actions: what sim.toml takes.
    let (code, out, err) = check_file(&write_config(&dir, &settings(50)));
    let reachable = format!(
        "policy server: {url} reachable; action_dim 7 (configuration takes 7), action_horizon 50"
    );
    assert!(out.contains(&reachable), "{out}{err}");
    assert_eq!(code, Some(0), "{out}{err}");
    // Chunks longer than the configuration takes: every reply would be refused.
    let (code, out, err) = check_file(&write_config(&dir, &settings(40)));
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("the server's action_horizon is 50 steps, the configuration takes 2 to 40"),
        "{err}"
    );
    assert!(last_line(&out).contains("NOT valid: 1 error"), "{out}");
}
