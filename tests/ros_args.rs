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
}

#[test]
fn when_command_line_malformed_expect_exit_2() {
    for args in [
        &["--config", "config/sim.toml", "--ros-args", "--frobnicate"][..],
        &[
            "--config",
            "config/sim.toml",
            "--ros-args",
            "-r",
            "joint_states",
        ],
        &["--config", "config/sim.toml", "--ros-args", "-r", ":=/x"],
        &["--config", "config/sim.toml", "--ros-args", "-p"],
        &[],
        &["--config"],
        &["--bogus"],
    ] {
        let (code, _, err) = check(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
    let (_, _, err) = check(&[]);
    assert!(err.contains("--config"), "{err}");
}

#[test]
fn when_remap_gives_invalid_ros_name_expect_check_refuses_naming_it() {
    let ros = "io = \"ros\"\n";
    let dir = common::scratch_dir("ros-names");
    let cfg = dir.join("ros.toml");
    let text = std::fs::read_to_string(common::root().join("config/sim.toml"))
        .unwrap()
        .replace("io = \"sim\"\n", ros)
        .replace(
            "../urdf",
            &common::root().join("urdf").display().to_string(),
        )
        .replace(
            "../models",
            &common::root().join("models").display().to_string(),
        )
        .replace("[sim]", "[ros]\ncameras = [\"/cam\"]\n[sim]");
    std::fs::write(&cfg, text).unwrap();
    let cfg = cfg.display().to_string();
    let (code, _, err) = check(&["--config", &cfg, "--ros-args", "-r", "__node:=2arm"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`__node`") && err.contains("\"2arm\" is not a ROS node name"),
        "{err}"
    );
    let (code, _, err) = check(&["--config", &cfg, "--ros-args", "-r", "/cam:=/cam/1raw"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("remap /cam:=/cam/1raw") && err.contains("ros.cameras[0]"),
        "{err}"
    );
    let (code, out, err) = check(&["--config", &cfg, "--ros-args", "-r", "/nothing:=/else"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("remap /nothing:=/else matches no topic"),
        "{out}"
    );
}
