//! Table tests over `tests/config/{valid,invalid}-*.toml`: every valid file loads, every invalid
//! file is refused with an error that names the file and contains the text on its first line
//! (`# expect: ...`), which names the bad field, joint or link.

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
    for f in all {
        let text = std::fs::read_to_string(&f).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: first line must be '# expect: ...'", f.display()));
        let err = match Config::load(&f) {
            Ok(_) => panic!("{} should be refused", f.display()),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(expect),
            "{}:\n  error: {err}\n  expected to contain: {expect}",
            f.display()
        );
        let urdf_error = err.contains(".urdf:");
        let file_name = f.file_name().unwrap().to_str().unwrap();
        assert!(
            urdf_error || err.contains(file_name),
            "{}: error does not name the file: {err}",
            f.display()
        );
    }
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
