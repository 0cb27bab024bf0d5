//! The `acl` backend where no Ascend NPU or CANN is installed (here, CI): pi0d builds and runs,
//! and choosing the backend fails cleanly, naming the library it could not load. What needs a
//! board is listed in docs/ascend.md.

use crate::common;

use std::process::Command;

use common::{root, run_daemon, scratch_dir, sim_model_config, with_backend};

#[test]
fn when_cann_is_missing_expect_infer_and_daemon_to_name_the_library() {
    let dir = scratch_dir("acl-graphs");
    let bin = env!("CARGO_BIN_EXE_pi0d");
    let out = Command::new(bin)
        .args(["export", "--cameras", "1", "--checkpoint"])
        .arg(root().join("models/tiny-pi0"))
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new(bin)
        .args([
            "infer",
            "--backend",
            "acl",
            "--acl-library",
            "/opt/no-cann/libascendcl.so",
        ])
        .arg("--model-dir")
        .arg(&dir)
        .arg("--inputs")
        .arg(root().join("tests/fixtures/cases/pi0_f32_1cam_short/inputs.safetensors"))
        .arg("--output")
        .arg(dir.join("actions.safetensors"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot load AscendCL (libascendcl.so)")
            && stderr.contains("/opt/no-cann/libascendcl.so"),
        "{stderr}"
    );
    assert!(!dir.join("actions.safetensors").exists());

    // The daemon refuses to start on it: no motion from a policy it cannot run.
    let mut cfg = sim_model_config();
    with_backend(
        &mut cfg,
        "acl",
        &[
            ("model_dir", toml::Value::String(dir.display().to_string())),
            (
                "library",
                toml::Value::String("/opt/no-cann/libascendcl.so".into()),
            ),
        ],
    );
    let run = run_daemon("acl-missing", &cfg, 2.0);
    assert_ne!(run.code(), 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot load AscendCL"),
        "{}",
        run.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}
