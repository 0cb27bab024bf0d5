//! The `acl` backend where no Ascend NPU or CANN is installed (here, CI): pi0d builds and runs,
//! and choosing the backend fails cleanly, naming the library it could not load. What needs a
//! board is listed in docs/ascend.md.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::acl::{self, assert_released};
use common::{assert_safe, root, run_daemon, scratch_dir, sim_model_config, with_backend, TempDir};

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
    let (cameras, batch, prompt) = (
        cameras.to_string(),
        shape[0].to_string(),
        shape[1].to_string(),
    );
    let mut args = vec![
        "--cameras",
        &cameras,
        "--batch",
        &batch,
        "--prompt-len",
        &prompt,
    ];
    args.extend(["--atc", soc]);
    args.extend(flags);
    acl::export(&checkpoint, &args, &dir);
    dir
}

/// What one command did on the AscendCL model.
struct OnModel {
    status: Option<i32>,
    stderr: String,
    /// The model's report: calls, errors, what was still held at `aclFinalize`.
    report: serde_json::Value,
}

/// `pi0d infer --backend acl` of `case` on the graphs in `dir`, the model set up by `env`.
fn infer(dir: &Path, case: &str, args: &[&str], env: &[(&'static str, &str)]) -> OnModel {
    let report_path = dir.join("acl-report.json");
    let _ = std::fs::remove_file(&report_path);
    let _ = std::fs::remove_file(dir.join("actions.safetensors"));
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["infer", "--backend", "acl", "--acl-library"])
        .arg(acl::library())
        .arg("--model-dir")
        .arg(dir)
        .arg("--inputs")
        .arg(case_dir(case).join("inputs.safetensors"))
        .arg("--output")
        .arg(dir.join("actions.safetensors"))
        .args(args)
        .envs(acl::env(&report_path, env))
        .output()
        .unwrap();
    OnModel {
        status: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: acl::report(&report_path),
    }
}

fn max_error(dir: &Path, case: &str) -> f32 {
    let got = TensorFile::read(&dir.join("actions.safetensors")).unwrap();
    let (_, got) = got.f32("actions", &[None, None, None]).unwrap();
    let want = TensorFile::read(&case_dir(case).join("expected.safetensors")).unwrap();
    let (_, want) = want.f32("actions", &[None, None, None]).unwrap();
    assert!(
        want.iter().any(|x| x.abs() > 0.5),
        "{case}: reference near zero"
    );
    common::max_diff(got, want)
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
        // A pi0.5 trained for real-time chunking: the host clamps between looped runs, the
        // unrolled graph clamps itself.
        ("pi05_f32_rtc_trained_d3", &[], 1e-5, 11),
        ("pi05_f32_rtc_trained_d8_batch2", &["--unroll"], 1e-5, 2),
    ];
    for &(case, flags, tolerance, executions) in cases {
        let dir = compiled(case, flags, "Ascend310P1");
        let rtc = if case_json(case).get("rtc_schedule").is_some() {
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

#[test]
fn when_the_ascendcl_model_refuses_or_fails_expect_the_code_named_and_everything_released() {
    let case = "pi0_f32_1cam_short";
    // Compiled by `pi0d export --atc` for another SoC than the device's: refused at load.
    let dir = compiled(case, &[], "Ascend310B1");
    let run = infer(&dir, case, &[], &[("ACL_MODEL_SOC", "Ascend310P1")]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "the offline models were compiled for Ascend310B1, this NPU is Ascend310P1: compile them again with `pi0d export --atc Ascend310P1`"
        ),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.report["calls"]["aclmdlLoadFromFile"],
        serde_json::Value::Null
    );
    assert_released(&run.report, &run.stderr);
    // Compiled some other way (no record of ATC's SoC): 507011 at execution, as a board
    // answers.
    std::fs::remove_file(dir.join("compiled.json")).unwrap();
    let run = infer(&dir, case, &[], &[("ACL_MODEL_SOC", "Ascend310P1")]);
    assert_eq!(run.status, Some(9), "{}", run.stderr);
    for said in [
        "507011 ACL_ERROR_RT_MODEL_EXECUTE",
        "re-run ATC with the right --soc_version",
        "compiled for Ascend310B1, this device is Ascend310P1",
    ] {
        assert!(
            run.stderr.contains(said),
            "`{said}` not in:\n{}",
            run.stderr
        );
    }
    assert!(!dir.join("actions.safetensors").exists());
    assert_released(&run.report, &run.stderr);

    let dir = compiled(case, &[], "Ascend310P1");
    // A device the machine does not have.
    let run = infer(&dir, case, &["--device-id", "1"], &[]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("policy.acl.device_id 1: this machine has 1 NPU(s)"),
        "{}",
        run.stderr
    );
    assert_released(&run.report, &run.stderr);
    // Device memory refused part way through the load: what was taken is given back.
    let run = infer(&dir, case, &[], &[("ACL_MODEL_MALLOC_FAIL_AFTER", "3")]);
    assert_ne!(run.status, Some(0), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("failed: 207001 ACL_ERROR_RT_MEMORY_ALLOCATION"),
        "{}",
        run.stderr
    );
    assert_eq!(run.report["calls"]["aclrtMalloc"], 4, "{}", run.report);
    assert_released(&run.report, &run.stderr);

    // An execution refused as the denoising steps are queued (the prefix ran, then 4 steps
    // were queued): the error is named, the steps left on the stream are run before the
    // stream is destroyed (destroying it with work queued is an error), nothing leaks.
    let run = infer(&dir, case, &[], &[("ACL_MODEL_EXECUTE_FAIL_AFTER", "5")]);
    assert_eq!(run.status, Some(9), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("aclmdlExecuteAsync failed: 507011 ACL_ERROR_RT_MODEL_EXECUTE"),
        "{}",
        run.stderr
    );
    let errors = run.report["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "only the injected refusal: {}", run.report);
    assert_released(&run.report, &run.stderr);
}

/// The bundled model's graphs for the simulated arm, compiled by the ATC model.
fn sim_graphs() -> TempDir {
    let dir = scratch_dir("acl-sim-graphs");
    let args = ["--cameras", "1", "--atc", "Ascend310P1"];
    acl::export(&root().join("models/tiny-pi0"), &args, &dir);
    dir
}

#[test]
fn when_the_daemon_drives_the_sim_on_the_ascendcl_model_expect_chunks_and_faults_ending_in_a_controlled_stop(
) {
    let graphs = sim_graphs();
    let mut cfg = sim_model_config();
    acl::with_backend_on(&mut cfg, &graphs);
    let on_model = |name: &str, seconds: f64, faults: &[(&'static str, &str)]| {
        let report = graphs.join(format!("{name}.json"));
        let env = acl::env(&report, faults);
        let run = common::run_daemon_in(
            name,
            &cfg,
            seconds,
            &["--quiet"],
            std::time::Duration::from_secs(60),
            &env,
        );
        (run, acl::report(&report))
    };

    // `pi0d check` loads the models as `run` does.
    let report = graphs.join("check.json");
    let dir = scratch_dir("acl-check");
    let config = dir.join("config.toml");
    std::fs::write(&config, toml::to_string(&cfg).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("check")
        .arg("--config")
        .arg(&config)
        .envs(acl::env(&report, &[]))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    // What it found: the library, its version, the SoC, the devices, what the models were
    // compiled for.
    for found in [
        "AscendCL models loaded",
        "libascendcl.so",
        "version=1.8.0",
        "soc=Ascend310P1",
        "devices=1",
        "compiled_for=Ascend310P1",
    ] {
        assert!(said.contains(found), "`{found}` not in:\n{said}");
    }
    assert_released(&acl::report(&report), &said);

    let (run, r) = on_model("acl-daemon", 4.0, &[]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    assert_safe(&run, &cfg);
    let s = run.summary();
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(s["chunks_rejected"], 0, "{s}");
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
    assert!(r["executions"].as_u64().unwrap() >= 4 * 11, "{r}");
    assert_released(&r, &run.stderr);

    // The device lost mid-run (after 5 inferences of 11 executions), and executions refused
    // from the 60th on: each ends the run with the arm brought to rest, exit 9, the cause said.
    for (name, fault, said) in [
        (
            "acl-device-lost",
            ("ACL_MODEL_DEVICE_LOST_AFTER", "55"),
            "the policy's accelerator answers no more",
        ),
        (
            "acl-execute-refused",
            ("ACL_MODEL_EXECUTE_FAIL_AFTER", "60"),
            "the policy's accelerator failed 3 inferences in a row",
        ),
    ] {
        let (run, r) = on_model(name, 20.0, &[fault]);
        assert_eq!(run.code(), 9, "{name}: {}", run.stderr);
        assert!(
            run.stderr.contains(said),
            "{name}: `{said}` not in:\n{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("decelerating to rest, then exiting"),
            "{name}: {}",
            run.stderr
        );
        let s = run.summary();
        assert_eq!(s["exit"], "runtime_failure", "{name}: {s}");
        assert!(s["chunks_accepted"].as_u64().unwrap() >= 2, "{name}: {s}");
        assert_eq!(s["limit_violations"], 0, "{name}: {s}");
        assert_released(&r, &run.stderr);
    }
}
