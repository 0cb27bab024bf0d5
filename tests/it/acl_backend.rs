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

// ---- On the AscendCL model (tools/ascendcl-model): the backend's whole calling sequence ----

use std::path::{Path, PathBuf};

use common::{acl_model, acl_model_env, TempDir};
use pi0d::policy::pi0::tensorfile::TensorFile;

fn case_dir(case: &str) -> PathBuf {
    root().join("tests/fixtures/cases").join(case)
}

fn case_json(case: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("case.json")).unwrap())
        .unwrap()
}

/// The graphs of `case`'s checkpoint, exported for its inputs' sizes with `flags`, compiled by
/// the ATC model for `soc` (as `pi0d export --atc` runs ATC when it is on the PATH).
fn compiled(case: &str, flags: &[&str], soc: &str) -> TempDir {
    let inputs = TensorFile::read(&case_dir(case).join("inputs.safetensors")).unwrap();
    let cameras = (0..)
        .take_while(|i| inputs.tensors.contains_key(&format!("image{i}")))
        .count();
    let (shape, _) = inputs.i64("lang_tokens", &[None, None]).unwrap();
    let dir = scratch_dir(&format!("acl-{case}-{}", flags.join("")));
    let checkpoint = root()
        .join("tests/fixtures")
        .join(case_json(case)["checkpoint"].as_str().unwrap());
    let report = dir.join("unused.json");
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("export")
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(["--cameras", &cameras.to_string()])
        .args(["--batch", &shape[0].to_string()])
        .args(["--prompt-len", &shape[1].to_string()])
        .args(["--atc", soc])
        .args(flags)
        .arg("--out")
        .arg(&dir)
        .envs(acl_model_env(&report, &[]))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ATC run success"),
        "ATC did not run: {stdout}"
    );
    dir
}

/// What one command did on the AscendCL model.
struct OnModel {
    status: Option<i32>,
    stderr: String,
    /// The model's report: calls, errors, what was still held at `aclFinalize`.
    report: serde_json::Value,
}

fn report(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no AscendCL model report at {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `pi0d infer --backend acl` of `case` on the graphs in `dir`, the model set up by `env`.
fn infer(dir: &Path, case: &str, args: &[&str], env: &[(&str, &str)]) -> OnModel {
    let report_path = dir.join("acl-report.json");
    let _ = std::fs::remove_file(&report_path);
    let _ = std::fs::remove_file(dir.join("actions.safetensors"));
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["infer", "--backend", "acl", "--acl-library"])
        .arg(acl_model())
        .arg("--model-dir")
        .arg(dir)
        .arg("--inputs")
        .arg(case_dir(case).join("inputs.safetensors"))
        .arg("--output")
        .arg(dir.join("actions.safetensors"))
        .args(args)
        .envs(acl_model_env(&report_path, env))
        .output()
        .unwrap();
    OnModel {
        status: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: report(&report_path),
    }
}

/// Every resource pi0d took from AscendCL was given back and AscendCL finalized.
fn assert_released(r: &serde_json::Value, stderr: &str) {
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

fn max_error(dir: &Path, case: &str) -> f32 {
    let got = TensorFile::read(&dir.join("actions.safetensors")).unwrap();
    let (_, got) = got.f32("actions", &[None, None, None]).unwrap();
    let want = TensorFile::read(&case_dir(case).join("expected.safetensors")).unwrap();
    let (_, want) = want.f32("actions", &[None, None, None]).unwrap();
    assert_eq!(got.len(), want.len());
    assert!(
        want.iter().any(|x| x.abs() > 0.5),
        "{case}: reference near zero"
    );
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

fn rtc_args(case: &str) -> Vec<String> {
    let json = case_json(case);
    vec![
        "--rtc-schedule".into(),
        json["rtc_schedule"].as_str().unwrap().into(),
        "--rtc-max-guidance".into(),
        json["rtc_max_guidance"].to_string(),
    ]
}

#[test]
fn when_the_golden_cases_run_on_the_ascendcl_model_expect_lerobot_actions_and_everything_released()
{
    // (case, export flags, tolerance, executions per inference: prefix + denoise runs)
    let cases: &[(&str, &[&str], f32, u64)] = &[
        ("pi0_f32_1cam_short", &[], 1e-4, 11),
        ("pi0_f32_2cam_batch2", &["--unroll"], 1e-4, 2),
        ("pi05_f32_1cam", &[], 1e-4, 11),
        ("pi0_f32_2cam_batch2", &["--dtype", "f16"], 3e-2, 11),
        ("pi0_f32_rtc_exp_batch2", &[], 1e-4, 11),
        ("pi0_f32_rtc_zeros", &["--unroll", "--rtc"], 1e-4, 2),
    ];
    for &(case, flags, tolerance, executions) in cases {
        let dir = compiled(case, flags, "Ascend310P1");
        let rtc = if case.contains("rtc") {
            rtc_args(case)
        } else {
            Vec::new()
        };
        let rtc: Vec<&str> = rtc.iter().map(String::as_str).collect();
        let run = infer(&dir, case, &rtc, &[]);
        assert_eq!(run.status, Some(0), "{case} {flags:?}: {}", run.stderr);
        let err = max_error(&dir, case);
        eprintln!("{case} {flags:?} on the AscendCL model: max abs error {err:.1e}");
        assert!(err <= tolerance, "{case} {flags:?}: {err}");
        let r = &run.report;
        assert_eq!(r["errors"], serde_json::json!([]), "{case} {flags:?}: {r}");
        assert_eq!(r["executions"], executions, "{case} {flags:?}: {r}");
        assert_released(r, &run.stderr);
    }
}
