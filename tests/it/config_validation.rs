//! Table tests over `tests/config/{valid,invalid}-*.toml`: every valid file loads, every invalid
//! file is refused with an error that names the file and contains the text on its first line
//! (`# expect: ...`), which names the bad field, joint or link.

use crate::common;

use std::path::{Path, PathBuf};

use pi0d::config::Config;

fn files(prefix: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/config exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(".toml")
        })
        .collect();
    out.sort();
    out
}

#[test]
fn when_config_valid_expect_it_loads() {
    let mut all = files("valid-");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    all.push(root.join("config/sim.toml"));
    all.push(root.join("config/pi0d.example.toml"));
    all.push(root.join("config/ur5e.toml"));
    all.push(root.join("config/aloha.toml"));
    all.push(root.join("config/hil.toml"));
    all.push(root.join("config/hil_task.toml"));
    assert!(all.len() >= 4);
    for f in all {
        if let Err(e) = Config::load(&f) {
            panic!("{} should load: {e}", f.display());
        }
    }
}

#[test]
fn when_config_invalid_expect_error_naming_file_and_field() {
    let all = files("invalid-");
    assert!(
        all.len() >= 15,
        "expected the invalid-config table, found {}",
        all.len()
    );
    let mut failures = Vec::new();
    for f in all {
        let text = std::fs::read_to_string(&f).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: first line must be '# expect: ...'", f.display()));
        let err = match Config::load(&f) {
            Ok(_) => {
                failures.push(format!("{} should be refused", f.display()));
                continue;
            }
            Err(e) => e.to_string(),
        };
        if !err.contains(expect) {
            failures.push(format!(
                "{}:\n  error: {err}\n  expected to contain: {expect}",
                f.display()
            ));
        }
        let urdf_error = err.contains(".urdf:");
        let file_name = f.file_name().unwrap().to_str().unwrap();
        if !(urdf_error || err.contains(file_name)) {
            failures.push(format!(
                "{}: error does not name the file: {err}",
                f.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn when_sim_config_loaded_expect_urdf_limits_merged_with_config() {
    let cfg = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim.toml")).unwrap();
    let j = |n: &str| {
        cfg.limits
            .joints
            .iter()
            .find(|j| j.name == n)
            .unwrap()
            .clone()
    };
    // URDF soft limit (2.8) is tighter than limit - margin (2.9 - 0.05).
    assert_eq!(j("shoulder_pan").upper, 2.8);
    assert!((j("elbow").upper - 2.35).abs() < 1e-12);
    assert!(j("wrist_3").upper.is_infinite() && j("wrist_3").lower.is_infinite());
    assert_eq!(j("gripper").acceleration, 0.5);
    assert_eq!(j("gripper").velocity, 0.1);
    assert_eq!(j("elbow").jerk, 150.0);
}

fn sim_toml_with(extra: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config/sim.toml")).unwrap();
    // Its paths (the URDF, the bundled model) made absolute.
    let text = text.replace("\"../", &format!("\"{}/", root.display()));
    format!("{text}\n{extra}")
}

#[test]
fn when_the_sim_task_is_wrong_expect_its_field_and_what_was_expected() {
    let workspace = "[workspace]\nbase_link = \"base_link\"\ntool_link = \"tool0\"\nmin = [-0.8, -0.8, 0.0]\nmax = [0.8, 0.8, 1.0]\n";
    let cases = [
        (
            "elbow = [0.4, 1.0]",
            "elbw = [0.4, 1.0]",
            "`sim.task.reach.elbw`: no such joint in robot.joints",
        ),
        (
            "elbow = [0.4, 1.0]",
            "elbow = [0.4, 3.0]",
            "`sim.task.reach.elbow`: 3 is outside the joint's position limits",
        ),
        (
            "shoulder_pan = [-0.9, 0.9]",
            "shoulder_pan = [-0.9, 0.9]\nelbow = [0.4, 0.5]",
            "`sim.task.sweep.elbow`: is also in sim.task.reach",
        ),
        (
            "view_max = [0.75, 0.5]",
            "view_max = [0.75, 0.2]",
            "outside the view (sim.task.view_min",
        ),
        (
            "view_max = [0.75, 0.5]",
            "view_max = [-0.3, 0.5]",
            "`sim.task.view_min`: [0] = -0.25 must be below",
        ),
        (workspace, "", "`sim.task`: needs a [workspace] section"),
        ("radius_m = 0.04", "radius_m = 0.0", "`sim.task.radius_m`"),
    ];
    for (from, to, want) in cases {
        let text = sim_toml_with("");
        assert!(text.contains(from), "config/sim.toml lacks {from:?}");
        let err = Config::parse(Path::new("task.toml"), &text.replacen(from, to, 1))
            .err()
            .unwrap_or_else(|| panic!("{to:?} accepted"))
            .to_string();
        assert!(
            err.contains("task.toml") && err.contains(want),
            "{to:?}: {err}"
        );
    }
    // Without [sim.task] the simulator draws its pattern: no task, no error.
    let start = sim_toml_with("").find("[sim.task]").unwrap();
    let cfg = Config::parse(Path::new("task.toml"), &sim_toml_with("")[..start]).unwrap();
    assert!(cfg.sim.cameras.len() == 1);
}

#[test]
fn when_embedded_default_loaded_expect_no_warning() {
    let cfg = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim.toml")).unwrap();
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
}

#[test]
fn when_settings_unused_by_chosen_kind_expect_warning_naming_them() {
    // An unused [ros] section, scripted-only settings on a pi0 policy, an ONNX section with the
    // CPU backend, a weighted-average weight with the blend merge.
    let text = sim_toml_with("[ros]\nnode = \"x\"\n")
        .replace(
            "kind = \"pi0\"",
            "kind = \"pi0\"\namplitude = 0.5\nbackend = \"cpu\"",
        )
        .replace(
            "merge = \"blend\"",
            "merge = \"blend\"\nweighted_average_old = 0.4",
        )
        + "[policy.onnx]\nmodel_dir = \"g\"\n";
    let cfg = Config::parse(Path::new("w.toml"), &text).unwrap();
    let fields: Vec<&str> = cfg.warnings.iter().map(|w| w.field.as_str()).collect();
    for f in [
        "ros",
        "policy.amplitude",
        "policy.onnx",
        "control.weighted_average_old",
    ] {
        assert!(
            fields.contains(&f),
            "no warning for {f}: {:?}",
            cfg.warnings
        );
    }
    let text = cfg
        .warnings
        .iter()
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        text.contains("w.toml: `policy.amplitude`: ignored"),
        "{text}"
    );
    // A trajectory setting with another command type.
    let text = sim_toml_with(
        "[ros]\ncommand_type = \"float64_multi_array\"\ncommand_topic = \"/fwd/commands\"\ntrajectory_coast_s = 0.1\n",
    )
    .replace("io = \"sim\"", "io = \"ros\"");
    let cfg = Config::parse(Path::new("w.toml"), &text).unwrap();
    assert!(
        cfg.warnings
            .iter()
            .any(|w| w.field == "ros.trajectory_coast_s"),
        "{:?}",
        cfg.warnings
    );
}

#[test]
fn when_override_widens_urdf_limit_expect_warning() {
    // 4 rad/s (the URDF says 3.14) still brakes within control.stop_timeout_s.
    let text = sim_toml_with("[limits.joints.elbow]\nvelocity = 4.0\nupper = 9.0\n");
    let cfg = Config::parse(Path::new("w.toml"), &text).unwrap();
    let widen: Vec<String> = cfg
        .warnings
        .iter()
        .filter(|w| w.message.contains("widens"))
        .map(|w| w.to_string())
        .collect();
    assert_eq!(widen.len(), 2, "{widen:?}");
    assert!(
        widen
            .iter()
            .any(|w| w
                .contains("`limits.joints.elbow.velocity`: 4 widens the URDF's velocity limit")),
        "{widen:?}"
    );
    // Tightening is silent.
    let text = sim_toml_with("[limits.joints.elbow]\nvelocity = 0.5\n");
    assert!(Config::parse(Path::new("w.toml"), &text)
        .unwrap()
        .warnings
        .is_empty());
}

#[test]
fn when_ros_parameter_is_bad_expect_parameter_blamed_not_file() {
    use pi0d::config::ros_args;
    let text = sim_toml_with("");
    let refused_with = |param: &str| {
        let ros = ros_args::parse(&["-p".to_string(), param.to_string()]).unwrap();
        Config::parse_with(Path::new("w.toml"), &text, &ros)
            .unwrap_err()
            .to_string()
    };
    let e = refused_with("control.rate_hz:=fast");
    assert!(
        e.starts_with("--ros-args parameter `control.rate_hz`: `control.rate_hz`:"),
        "{e}"
    );
    assert!(!e.contains("w.toml"), "{e}");
    let e = refused_with("control.rate_hz:=5000");
    assert!(
        e.contains("--ros-args parameter `control.rate_hz`")
            && e.contains("expected 10..1000 Hz, found 5000"),
        "{e}"
    );
}

#[test]
fn when_prompt_too_long_expect_refused() {
    let long = format!("prompt = \"{}\"", "a".repeat(5000));
    let text: Vec<String> = sim_toml_with("")
        .lines()
        .map(|l| match l.starts_with("prompt = ") {
            true => long.clone(),
            false => l.to_string(),
        })
        .collect();
    let text = text.join("\n");
    let e = Config::parse(Path::new("w.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`policy.prompt`: 5000 bytes, expected at most"),
        "{e}"
    );
}

#[test]
fn when_realtime_is_not_configured_expect_fifo_80_for_control_and_70_for_ros_and_off_when_asked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sim = Config::load(&root.join("config/sim.toml")).unwrap();
    // As ros2_control's controller manager: real time is tried by default.
    assert_eq!(sim.realtime.priority, 80);
    assert_eq!(sim.realtime.io_priority, 70);
    assert!(!sim.realtime.lock_memory);
    let dir = common::scratch_dir("rt-default");
    let with = |section: &str| {
        let text = std::fs::read_to_string(root.join("config/sim.toml")).unwrap()
            + "\n[realtime]\n"
            + section;
        let file = dir.join("sim.toml");
        let text = text
            .replace("../urdf/", &format!("{}/urdf/", root.display()))
            .replace("../models/", &format!("{}/models/", root.display()));
        std::fs::write(&file, text).unwrap();
        Config::load(&file).map(|c| (c.realtime.priority, c.realtime.io_priority))
    };
    // Off is off for both; the ROS thread follows the control thread's priority.
    assert_eq!(with("priority = 0\n").unwrap(), (0, 0));
    assert_eq!(with("priority = 50\n").unwrap(), (50, 40));
    assert_eq!(with("priority = 5\n").unwrap(), (5, 0));
    assert_eq!(with("priority = 50\nio_priority = 0\n").unwrap(), (50, 0));
    // Never at or above the control thread.
    let e = with("priority = 50\nio_priority = 50\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`realtime.io_priority`") && e.contains("not below realtime.priority = 50"),
        "{e}"
    );
    let e = with("priority = 0\nio_priority = 10\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`realtime.io_priority`"), "{e}");
}

#[test]
fn when_drills_are_configured_expect_them_in_time_order_and_each_warned_about() {
    use pi0d::config::drill::DrillKind;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config/sim.toml")).unwrap()
        + "\n[[drill]]\nat_s = 5.0\nevent = \"crash_io\"\n"
        + "\n[[drill]]\nat_s = 2.0\nevent = \"stall_control\"\nduration_s = 0.5\n";
    let dir = common::scratch_dir("drills");
    let file = dir.join("sim.toml");
    let text = text
        .replace("../urdf/", &format!("{}/urdf/", root.display()))
        .replace("../models/", &format!("{}/models/", root.display()));
    std::fs::write(&file, text).unwrap();
    let cfg = Config::load(&file).unwrap();
    let kinds: Vec<(f64, DrillKind)> = cfg.drills.iter().map(|d| (d.at_s, d.kind)).collect();
    assert_eq!(
        kinds,
        [
            (2.0, DrillKind::StallControl { duration_s: 0.5 }),
            (5.0, DrillKind::CrashIo)
        ]
    );
    let warned: Vec<&str> = cfg
        .warnings
        .iter()
        .filter(|w| w.message.contains("never in production"))
        .map(|w| w.field.as_str())
        .collect();
    assert_eq!(warned, ["drill[0]", "drill[1]"], "{:?}", cfg.warnings);
}
