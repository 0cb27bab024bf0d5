//! `--ros-args` through the real binary, as launch_ros passes them.

use crate::common;

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

/// The command lines `launch/pi0d.launch.py` and `launch/pi0d.launch.xml` produce
/// (tests/peers/launch_check.py evaluates them without a ROS install).
fn launch_commands(file: &str, args: &[String]) -> Vec<Vec<String>> {
    let out = Command::new(common::root().join(".venv/bin/python"))
        .arg(common::root().join("tests/peers/launch_check.py"))
        .arg(common::root().join(file))
        .args(args)
        .output()
        .expect("the test venv's python (./tools/test.sh makes it)");
    assert!(
        out.status.success(),
        "{file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn when_pi0d_is_launched_from_either_launch_file_expect_it_runs_with_the_params_file() {
    let dir = common::scratch_dir("launch");
    let cfg = dir.join("sim.toml");
    std::fs::write(&cfg, toml::to_string(&common::sim_config()).unwrap()).unwrap();
    let params = common::root().join("tests/config/params.yaml");
    for file in ["launch/pi0d.launch.py", "launch/pi0d.launch.xml"] {
        for (with_params, rate) in [(true, 500.0), (false, 200.0)] {
            let mut args = vec![
                format!("config:={}", cfg.display()),
                format!("binary:={}", env!("CARGO_BIN_EXE_pi0d")),
                "node:=left_arm".to_string(),
            ];
            if with_params {
                args.push(format!("params_file:={}", params.display()));
            }
            let cmds = launch_commands(file, &args);
            assert_eq!(cmds.len(), 1, "{file}: {cmds:?}");
            let mut cmd = cmds[0].clone();
            assert_eq!(cmd[0], env!("CARGO_BIN_EXE_pi0d"));
            assert!(cmd.contains(&"__node:=left_arm".to_string()), "{cmd:?}");
            // A short run with a summary: pi0d's own flags go before --ros-args.
            let summary = dir.join("summary.json");
            let at = cmd.iter().position(|a| a == "--ros-args").unwrap();
            let extra = ["--duration", "1", "--summary", summary.to_str().unwrap()];
            cmd.splice(at..at, extra.iter().map(|s| s.to_string()));
            let out = Command::new(&cmd[0]).args(&cmd[1..]).output().unwrap();
            assert!(
                out.status.success(),
                "{file} {cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let s: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
            assert_eq!(s["rate_hz"], rate, "{file} with params {with_params}: {s}");
        }
    }
}
