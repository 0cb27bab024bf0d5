//! pi0 / pi0.5 against lerobot's own outputs (fixtures made by tools/make_golden.py with
//! lerobot 0.6.1): tiny models built by lerobot's classes, random weights, fixed noise.

use crate::common;

use std::path::{Path, PathBuf};

use common::edited_checkpoint;

use pi0d::policy::pi0::infer::{run_batch, Batch};
use pi0d::policy::pi0::tensorfile::TensorFile;
use pi0d::policy::pi0::{Checkpoint, Pi0Model, Variant};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn case_checkpoint(case: &Path) -> PathBuf {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(case.join("case.json")).unwrap()).unwrap();
    fixtures().join(json["checkpoint"].as_str().unwrap())
}

/// Runs one case; returns the largest absolute difference from lerobot's actions.
fn max_error(case: &str, threads: usize) -> (f32, Variant) {
    let dir = fixtures().join("cases").join(case);
    let ck = Checkpoint::load(&case_checkpoint(&dir)).unwrap();
    let model = Pi0Model::load(&ck, None, threads).unwrap();
    let batch = Batch::read(&dir.join("inputs.safetensors"), &model).unwrap();
    let (actions, _) = run_batch(&model, &batch);
    let expected = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
    let (shape, want) = expected.f32("actions", &[None, None, None]).unwrap();
    assert_eq!(
        shape,
        vec![batch.batch, model.arch.chunk, model.arch.action_dim]
    );
    assert_eq!(actions.len(), want.len());
    let err = actions
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // Not trivially equal: the chunk moves far from its noise.
    assert!(want.iter().any(|x| x.abs() > 0.5));
    eprintln!("{case}: max abs error against lerobot {err:.1e}");
    (err, model.arch.variant)
}

#[test]
fn when_pi0_f32_expect_lerobot_actions_within_1e4() {
    for case in [
        "pi0_f32_1cam_short",
        "pi0_f32_2cam_batch2",
        "pi0_f32_3cam_masked",
    ] {
        let (err, variant) = max_error(case, 1);
        assert_eq!(variant, Variant::Pi0);
        assert!(err <= 1e-4, "{case}: max abs error {err}");
    }
}

#[test]
fn when_pi0_f16_checkpoint_expect_lerobot_actions_within_1e4() {
    // Every tensor stored as f16; lerobot's reference ran the same f16-rounded weights.
    let (err, _) = max_error("pi0_f16_2cam", 1);
    assert!(err <= 1e-4, "max abs error {err}");
}

#[test]
fn when_pi0_bf16_expect_lerobot_actions_within_2e2() {
    let (err, _) = max_error("pi0_bf16_2cam", 2);
    assert!(err <= 2e-2, "max abs error {err}");
}

#[test]
fn when_pi05_f32_expect_lerobot_actions_within_1e4() {
    for case in ["pi05_f32_1cam", "pi05_f32_2cam_batch2"] {
        let (err, variant) = max_error(case, 2);
        assert_eq!(variant, Variant::Pi05);
        assert!(err <= 1e-4, "{case}: max abs error {err}");
    }
}

#[test]
fn when_infer_cli_runs_expect_actions_file_and_timing_lines() {
    let case = fixtures().join("cases/pi0_f32_1cam_short");
    let scratch = common::scratch_dir("infer-cli");
    let out = scratch.join("actions.safetensors");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["infer", "--repeat", "3", "--checkpoint"])
        .arg(fixtures().join("pi0_float32"))
        .arg("--inputs")
        .arg(case.join("inputs.safetensors"))
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        let stage = |k: &str| l[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {l}"));
        let (pre, p, s, post, t) = (
            stage("preprocess_ms"),
            stage("prefix_ms"),
            stage("steps_ms"),
            stage("postprocess_ms"),
            stage("total_ms"),
        );
        assert!(p > 0.0 && s > 0.0 && pre >= 0.0 && post > 0.0, "{l}");
        assert!((pre + p + s + post - t).abs() < 1e-6, "{l}");
    }
    let got = TensorFile::read(&out).unwrap();
    let (_, a) = got.f32("actions", &[Some(1), Some(50), Some(32)]).unwrap();
    let want = TensorFile::read(&case.join("expected.safetensors")).unwrap();
    let (_, e) = want.f32("actions", &[Some(1), Some(50), Some(32)]).unwrap();
    assert!(a.iter().zip(e).all(|(x, y)| (x - y).abs() <= 1e-4));
}

fn load_error(dir: &Path) -> String {
    let ck = match Checkpoint::load(dir) {
        Ok(ck) => ck,
        Err(e) => return e.to_string(),
    };
    match Pi0Model::load(&ck, None, 1) {
        Ok(_) => panic!("{} should be refused", dir.display()),
        Err(e) => e.to_string(),
    }
}

const STATE_PROJ: &str = "model.state_proj.weight";

#[test]
fn when_tensor_missing_expect_error_naming_it() {
    let dir = edited_checkpoint("missing", |t| t.retain(|(n, ..)| n != STATE_PROJ));
    let e = load_error(&dir);
    assert!(
        e.contains("state_proj.weight") && e.contains("not found"),
        "{e}"
    );
}

#[test]
fn when_tensor_shape_wrong_expect_expected_and_found_shapes() {
    let dir = edited_checkpoint("shape", |t| {
        let x = t.iter_mut().find(|(n, ..)| n == STATE_PROJ).unwrap();
        x.2 = vec![16, 64];
    });
    let e = load_error(&dir);
    assert!(
        e.contains("state_proj.weight")
            && e.contains("[16, 64]")
            && e.contains("expected [32, 32]"),
        "{e}"
    );
}

#[test]
fn when_weight_not_finite_expect_checkpoint_refused() {
    let dir = edited_checkpoint("nan", |t| {
        let x = t.iter_mut().find(|(n, ..)| n == STATE_PROJ).unwrap();
        x.3[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let e = load_error(&dir);
    assert!(
        e.contains("state_proj.weight") && e.contains("non-finite") && e.contains("index 2"),
        "{e}"
    );
}

#[test]
fn when_text_embedding_not_finite_expect_checkpoint_refused() {
    // The embedding is read a row at a time from the map, never decoded whole: still checked.
    let dir = edited_checkpoint("nan-embed", |t| {
        let x = t
            .iter_mut()
            .find(|(n, ..)| n.ends_with("embed_tokens.weight"))
            .unwrap();
        let last = x.3.len() - 4;
        x.3[last..].copy_from_slice(&f32::INFINITY.to_le_bytes());
    });
    let e = load_error(&dir);
    assert!(
        e.contains("embed_tokens.weight") && e.contains("non-finite"),
        "{e}"
    );
}

#[test]
fn when_tensor_dtype_unsupported_expect_error_naming_dtype() {
    let dir = edited_checkpoint("dtype", |t| {
        let x = t.iter_mut().find(|(n, ..)| n == STATE_PROJ).unwrap();
        x.1 = safetensors::Dtype::I32;
    });
    let e = load_error(&dir);
    assert!(e.contains("state_proj.weight") && e.contains("I32"), "{e}");
}

#[test]
fn when_head_counts_do_not_fit_expect_hint_to_pass_arch() {
    let dir = edited_checkpoint("arch", |_| {});
    std::fs::remove_file(dir.join("arch.json")).unwrap();
    let e = load_error(&dir);
    // Both places head counts can be given: the command line and the config file.
    assert!(e.contains("--arch") && e.contains("policy.arch"), "{e}");
}

#[test]
fn when_keys_lack_model_prefix_and_embedding_only_in_lm_head_expect_same_actions() {
    // Older exports omit the leading `model.` and keep the word embedding only as lm_head.
    let dir = edited_checkpoint("aliases", |t| {
        t.retain(|(n, ..)| !n.ends_with("paligemma.lm_head.weight"));
        for x in t.iter_mut() {
            if x.0.ends_with("language_model.embed_tokens.weight") {
                x.0 = "model.paligemma_with_expert.paligemma.lm_head.weight".into();
            }
            x.0 = x.0.trim_start_matches("model.").to_string();
        }
    });
    let case = fixtures().join("cases/pi0_f32_1cam_short");
    let ck = Checkpoint::load(&dir).unwrap();
    let model = Pi0Model::load(&ck, None, 1).unwrap();
    let batch = Batch::read(&case.join("inputs.safetensors"), &model).unwrap();
    let (actions, _) = run_batch(&model, &batch);
    let want = TensorFile::read(&case.join("expected.safetensors")).unwrap();
    let (_, e) = want.f32("actions", &[Some(1), Some(50), Some(32)]).unwrap();
    assert!(actions.iter().zip(e).all(|(a, b)| (a - b).abs() <= 1e-4));
}

#[test]
fn when_check_loads_a_checkpoint_of_another_width_expect_exit_1_naming_both() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["check", "--config"])
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/config/check-pi0-width-mismatch.toml"),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pi0_float32") && err.contains("7 joints") && err.contains("lists 1"),
        "{err}"
    );
}

/// Runs one real-time-chunking case (lerobot's `RTCProcessor` through `sample_actions`); returns
/// the largest difference from lerobot's guided actions and from its unguided ones.
fn rtc_error(case: &str) -> (f32, f32) {
    use pi0d::config::{RtcSettings, Schedule};
    let dir = fixtures().join("cases").join(case);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let ck = Checkpoint::load(&case_checkpoint(&dir)).unwrap();
    let model = Pi0Model::load(&ck, None, 2).unwrap();
    let mut batch = Batch::read(&dir.join("inputs.safetensors"), &model).unwrap();
    assert!(batch.has_rtc(), "{case}: no rtc_prev_chunk");
    batch
        .set_rtc(RtcSettings {
            schedule: Schedule::parse(json["rtc_schedule"].as_str().unwrap()).unwrap(),
            max_guidance_weight: json["rtc_max_guidance"].as_f64().unwrap() as f32,
        })
        .unwrap();
    let (actions, _) = run_batch(&model, &batch);
    let expected = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
    let (_, want) = expected.f32("actions", &[None, None, None]).unwrap();
    let (_, plain) = expected.f32("plain_actions", &[None, None, None]).unwrap();
    let diff = |b: &[f32]| {
        actions
            .iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max)
    };
    assert_eq!(actions.len(), want.len());
    let (err, off) = (diff(want), diff(plain));
    eprintln!(
        "{case}: max abs error against lerobot's RTC {err:.1e} (unguided differs by {off:.2})"
    );
    (err, off)
}

#[test]
fn when_rtc_leftover_given_expect_lerobot_guided_actions_within_1e4() {
    for case in [
        "pi0_f32_rtc_linear",
        "pi0_f32_rtc_exp_batch2",
        "pi0_f32_rtc_zeros",
        "pi0_f32_rtc_ones_short",
        "pi0_f32_rtc_saturated",
        "pi05_f32_rtc_linear",
        "pi05_f32_rtc_exp_full",
    ] {
        let (err, off) = rtc_error(case);
        assert!(err <= 1e-4, "{case}: max abs error {err}");
        // The guidance matters: unguided actions are far from lerobot's guided ones.
        assert!(off > 0.5, "{case}: guided and unguided agree ({off})");
    }
}
