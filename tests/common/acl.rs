//! Running pi0d on the model of AscendCL (tools/ascendcl-model: `libascendcl.so` and an `atc`
//! for a machine without an Ascend NPU), built beside pi0d by tools/test.sh.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{ort_library, root, with_backend};

/// The model's `libascendcl.so`.
pub fn library() -> PathBuf {
    let lib = Path::new(env!("CARGO_BIN_EXE_pi0d")).with_file_name("libascendcl.so");
    assert!(
        lib.is_file(),
        "{} is missing: build the AscendCL model with `cargo build -p ascendcl-model` (tools/test.sh does)",
        lib.display()
    );
    lib
}

/// The environment a command needs to run graphs on the model: its ATC model first on the
/// PATH, ONNX Runtime for its executions, its report written to `report`, and `settings` (the
/// model's `ACL_MODEL_*` variables: the device's SoC, faults).
pub fn env(report: &Path, settings: &[(&'static str, &str)]) -> Vec<(&'static str, OsString)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![root().join("tools/ascendcl-model")];
    dirs.extend(std::env::split_paths(&path));
    let mut env: Vec<(&'static str, OsString)> = vec![
        ("PATH", std::env::join_paths(dirs).unwrap()),
        ("ORT_DYLIB_PATH", ort_library().into_os_string()),
        ("ACL_MODEL_REPORT", report.as_os_str().to_owned()),
    ];
    for &(k, v) in settings {
        assert!(
            k.starts_with("ACL_MODEL_"),
            "not a setting of the AscendCL model: {k}"
        );
        env.push((k, v.into()));
    }
    env
}

/// `pi0d export --checkpoint CHECKPOINT ARGS --out OUT` with the ATC model on the PATH (pass
/// `--atc SOC` in `args` to have it compile the graphs); its stdout, the export having
/// succeeded.
pub fn export(checkpoint: &Path, args: &[&str], out: &Path) -> String {
    let run = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("export")
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(args)
        .arg("--out")
        .arg(out)
        .envs(env(&out.join("acl-export-report.json"), &[]))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        !args.contains(&"--atc") || stdout.contains("ATC run success"),
        "ATC did not run: {stdout}"
    );
    stdout
}

/// `policy.backend = "acl"` on the graphs in `graphs`, through the model's library.
pub fn with_backend_on(cfg: &mut toml::Table, graphs: &Path) {
    with_backend(
        cfg,
        "acl",
        &[
            (
                "model_dir",
                toml::Value::String(graphs.display().to_string()),
            ),
            (
                "library",
                toml::Value::String(library().display().to_string()),
            ),
        ],
    );
}

/// The model's report: calls, errors, what was still held at `aclFinalize`.
pub fn report(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no AscendCL model report at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Every resource pi0d took from AscendCL was given back and AscendCL finalized.
pub fn assert_released(r: &serde_json::Value, stderr: &str) {
    assert_eq!(
        r["finalized"], true,
        "aclFinalize never called: {r}\n{stderr}"
    );
    assert_eq!(
        r["leaks"],
        serde_json::json!({}),
        "still held at aclFinalize: {r}"
    );
}
