//! `--ros-args` through the real binary, as launch_ros passes them.

mod common;

use std::process::Command;

fn check(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .current_dir(common::root())
        .arg("check")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn when_params_file_and_params_given_expect_config_overridden() {
    let (code, out, err) = check(&[
        "--config",
        "config/sim.toml",
        "--ros-args",
        "--params-file",
        "tests/config/params.yaml",
        "-p",
        "control.blend_window_s:=0.3",
        "-r",
        "__node:=left_arm_policy",
    ]);
    assert_eq!(code, 0, "{err}");
    // From the file; the later -p wins over the file's blend window.
    assert!(
        out.contains("control: 500 Hz") && out.contains("blend 0.3 s"),
        "{out}"
    );
}

#[test]
fn when_config_given_as_ros_parameter_expect_it_loaded() {
    let (code, out, err) = check(&[
        "--ros-args",
        "-p",
        "config:=config/sim.toml",
        "-p",
        "control.rate_hz:=250",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("control: 250 Hz"), "{out}");
}

#[test]
fn when_parameter_names_no_setting_expect_exit_1_naming_it() {
    let (code, _, err) = check(&[
        "--config",
        "config/sim.toml",
        "--ros-args",
        "-p",
        "control.rate:=5",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown field `rate`"), "{err}");
    let (code, _, err) = check(&["--config", "config/sim.toml", "--ros-args", "--frobnicate"]);
    assert_eq!(code, 1);
    assert!(err.contains("--frobnicate"), "{err}");
    let (code, _, err) = check(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("--config"), "{err}");
}
