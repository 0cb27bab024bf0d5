//! `systemd/install.sh --root DIR` (no root needed) lays out what systemd/pi0d.service and
//! systemd/pi0d.toml.example name, so `pi0d check` on the installed configuration passes; a
//! second install keeps the configuration the user edited.

use std::path::Path;
use std::process::{Command, Output};

use crate::common;

use common::*;

/// `systemd/install.sh --root ROOT --binary <the binary under test> ARGS`.
fn install(root_dir: &Path, args: &[&str]) -> Output {
    Command::new(root().join("systemd/install.sh"))
        .arg("--root")
        .arg(root_dir)
        .args(["--binary", env!("CARGO_BIN_EXE_pi0d")])
        .args(args)
        .output()
        .expect("systemd/install.sh runs")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// The installed binary's `pi0d check --config ROOT/etc/pi0d/pi0d.toml`: exit code and output.
fn check_installed(root_dir: &Path) -> (Option<i32>, String) {
    let out = Command::new(root_dir.join("usr/local/bin/pi0d"))
        .args(["check", "--config"])
        .arg(root_dir.join("etc/pi0d/pi0d.toml"))
        .output()
        .expect("the installed pi0d runs");
    (out.status.code(), text(&out))
}

#[test]
fn when_installed_under_a_root_with_a_model_expect_check_to_pass() {
    let dir = scratch_dir("install-model");
    let model = root().join("models/tiny-pi0");
    let out = install(&dir, &["--model", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));

    // The files the unit and the example configuration name.
    for f in [
        "etc/pi0d/pi0d.env",
        "opt/pi0d/urdf/ur5e.urdf",
        "opt/pi0d/models/tiny-pi0/model.safetensors",
    ] {
        assert!(dir.join(f).is_file(), "{f} not installed:\n{}", text(&out));
    }
    assert!(dir.join("var/lib/pi0d/recordings").is_dir());
    let unit = std::fs::read(dir.join("etc/systemd/system/pi0d.service")).unwrap();
    assert_eq!(
        unit,
        std::fs::read(root().join("systemd/pi0d.service")).unwrap(),
        "the unit is installed as it is"
    );
    // The configuration's absolute paths point under the root.
    let cfg: toml::Table = std::fs::read_to_string(dir.join("etc/pi0d/pi0d.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let under = |v: &toml::Value| Path::new(v.as_str().unwrap()).starts_with(dir.path());
    assert!(under(&cfg["robot"]["urdf"]), "{}", cfg["robot"]["urdf"]);
    assert!(
        under(&cfg["policy"]["checkpoint"]),
        "{}",
        cfg["policy"]["checkpoint"]
    );

    let (code, said) = check_installed(&dir);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("/etc/pi0d/pi0d.toml is valid"), "{said}");
}

#[test]
fn when_installed_without_a_model_expect_check_to_name_only_the_checkpoint() {
    let dir = scratch_dir("install-no-model");
    let out = install(&dir, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("set policy.checkpoint"),
        "the next step is said: {}",
        text(&out)
    );
    let (code, said) = check_installed(&dir);
    assert_eq!(code, Some(1), "{said}");
    // The URDF is there: the placeholder checkpoint is the one error left.
    assert!(said.contains("NOT valid: 1 error"), "{said}");
    let error = said
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {said}"));
    assert!(error.contains("your-pi0-checkpoint"), "{error}");
}

#[test]
fn when_installed_again_expect_the_edited_config_kept() {
    let dir = scratch_dir("install-again");
    let model = root().join("models/tiny-pi0");
    let args = ["--model", model.to_str().unwrap()];
    assert!(install(&dir, &args).status.success());
    let cfg = dir.join("etc/pi0d/pi0d.toml");
    let edited = std::fs::read_to_string(&cfg).unwrap() + "\n# edited by the user\n";
    std::fs::write(&cfg, &edited).unwrap();

    let out = install(&dir, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), edited);
    assert!(text(&out).contains("exists: kept"), "{}", text(&out));
}

#[test]
fn when_the_binary_is_missing_expect_refused_naming_it_and_nothing_installed() {
    let dir = scratch_dir("install-no-binary");
    let missing = dir.join("no-such-pi0d");
    let out = Command::new(root().join("systemd/install.sh"))
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--binary")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("--binary {}", missing.display())),
        "{}",
        text(&out)
    );
    assert!(!dir.join("root/etc").exists(), "installed anyway");
}
