//! `pi0d quantize` as a user runs it: the bundled model quantized, checked and driving the
//! simulated arm through the daemon like any other checkpoint; refusals exit 1 naming why.

use std::path::Path;
use std::process::Command;

use crate::common;

use common::*;

fn pi0d(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(args)
        .output()
        .expect("pi0d runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// `pi0d quantize` of `checkpoint` into `out` with `scheme` and `more` arguments.
fn quantize(checkpoint: &Path, out: &Path, scheme: &str, more: &[&str]) -> (Option<i32>, String) {
    let (checkpoint, out) = (checkpoint.to_str().unwrap(), out.to_str().unwrap());
    let args = [
        "quantize",
        "--checkpoint",
        checkpoint,
        "--out",
        out,
        "--scheme",
        scheme,
    ];
    pi0d(&[&args[..], more].concat())
}

/// The `quantization.json` of the checkpoint `pi0d quantize` wrote into `dir`.
fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("quantization.json")).unwrap()).unwrap()
}

#[test]
fn when_the_bundled_model_is_quantized_expect_it_checked_and_driving_the_sim_arm() {
    let dir = scratch_dir("quantized-run");
    let model = root().join("models/tiny-pi0");
    for scheme in ["w8", "w8a8", "w4"] {
        let out = dir.join(format!("tiny-pi0-{scheme}"));
        // w4 needs calibration, or to be told it is not wanted.
        let rtn: &[&str] = if scheme == "w4" {
            &["--round-to-nearest"]
        } else {
            &[]
        };
        let (code, text) = quantize(&model, &out, scheme, rtn);
        assert_eq!(code, Some(0), "{text}");
        assert!(
            text.contains(&format!("linear weights to {scheme}")),
            "{text}"
        );
        assert!(
            text.contains(
                "quantized: vision, projector, language, expert; kept as they were: heads"
            ),
            "{text}"
        );
        let mut cfg = sim_model_config();
        cfg["policy"]["checkpoint"] = toml::Value::String(out.display().to_string());
        let (code, text) = check_config(&format!("quantized-{scheme}"), &cfg);
        assert_eq!(code, Some(0), "{text}");
        assert!(text.contains(&format!("weights: {scheme}")), "{text}");
        assert!(text.contains("rounded to nearest"), "{text}");
        let run = run_daemon(&format!("quantized-{scheme}"), &cfg, 3.0);
        assert_eq!(run.code(), 0, "{}", run.stderr);
        assert!(
            run.summary()["chunks_accepted"].as_u64().unwrap() > 0,
            "{}",
            run.stderr
        );
        assert_safe(&run, &cfg);
    }
}

#[test]
fn when_quantize_is_given_what_it_cannot_take_expect_a_refusal_naming_it() {
    let dir = scratch_dir("quantized-refusals");
    let out = dir.join("out");
    let bare = root().join("tests/fixtures/pi0_float32/model.safetensors");
    let (code, text) = quantize(&bare, &out, "w8", &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("expected a checkpoint directory"), "{text}");
    let model = root().join("models/tiny-pi0");
    // w4 without calibration: refused with the reason, and how to go on.
    let (code, text) = quantize(&model, &out, "w4", &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("--scheme w4 without --calibration")
            && text.contains("cosine 0.988")
            && text.contains("--round-to-nearest"),
        "{text}"
    );
    assert!(!out.exists());
    let (code, text) = quantize(&model, &out, "w4", &["--round-to-nearest", "--block", "24"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("--block 24: expected a power of two"),
        "{text}"
    );
    assert!(!out.exists());
}

#[test]
fn when_quantize_is_calibrated_expect_the_scales_in_the_checkpoint_and_every_misuse_refused() {
    let dir = scratch_dir("quantized-calibrated");
    let fixtures = root().join("tests/fixtures");
    let model = fixtures.join("pi0_float32");
    let inputs = fixtures.join("cases/pi0_f32_1cam_short/inputs.safetensors");
    let calibration = inputs.to_str().unwrap();
    let out = dir.join("w4");
    let (code, text) = quantize(&model, &out, "w4", &["--calibration", calibration]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("calibrated on 1 input file(s), 1 observation(s):"),
        "{text}"
    );
    assert_eq!(manifest(&out)["observations"], 1);
    // A long calibration says where it is.
    assert!(
        text.contains(&format!(
            "calibration: running the float model on {calibration} (1 of 1)"
        )) && text.contains("calibration: choosing scales and integers, input 1 of "),
        "{text}"
    );
    let m = manifest(&out);
    assert_eq!(m["calibration"][0], calibration, "{m}");
    assert!(!m["smoothing"].as_object().unwrap().is_empty(), "{m}");
    // It runs as any checkpoint: its actions for another input, finite.
    let actions = dir.join("actions.safetensors");
    let other = fixtures.join("cases/pi0_f32_2cam_batch2/inputs.safetensors");
    let (code, text) = pi0d(&[
        "infer",
        "--checkpoint",
        out.to_str().unwrap(),
        "--inputs",
        other.to_str().unwrap(),
        "--output",
        actions.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{text}");
    assert!(actions.exists());
    // The graphs divide the inputs by the scales too (checked against the CPU path in
    // tests/onnx_export).
    let (code, text) = pi0d(&[
        "export",
        "--cameras",
        "1",
        "--checkpoint",
        out.to_str().unwrap(),
        "--out",
        dir.join("graphs").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("w4 weights"), "{text}");
    assert_eq!(m["rounding"], "gptq", "{m}");
    // w8 is calibrated too (GPTQ's rounding); bf16 has nothing to choose; files that are not
    // model inputs are refused.
    let (code, text) = quantize(
        &model,
        &dir.join("w8"),
        "w8",
        &["--calibration", calibration],
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("rounded by GPTQ"), "{text}");
    assert_eq!(manifest(&dir.join("w8"))["rounding"], "gptq");
    // Each element of an inputs file is an observation. w8a8 chooses SmoothQuant's scales on
    // observations held out from those that made them: with one, it says it could not.
    let held_out =
        "one observation: SmoothQuant's scales were measured on the rows they were made from";
    let batch2 = fixtures.join("cases/pi0_f32_2cam_batch2/inputs.safetensors");
    for (file, observations) in [(&inputs, 1), (&batch2, 2)] {
        let out = dir.join(format!("w8a8-{observations}"));
        let (code, text) = quantize(
            &model,
            &out,
            "w8a8",
            &["--calibration", file.to_str().unwrap()],
        );
        assert_eq!(code, Some(0), "{text}");
        assert!(
            text.contains(&format!(
                "calibrated on 1 input file(s), {observations} observation(s):"
            )) && text.contains(held_out) == (observations == 1),
            "{text}"
        );
        assert_eq!(manifest(&out)["observations"], observations);
    }
    let (code, text) = quantize(
        &model,
        &dir.join("bf16"),
        "bf16",
        &["--calibration", calibration],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("--calibration with --scheme bf16"), "{text}");
    let config = model.join("config.json");
    let (code, text) = quantize(
        &model,
        &dir.join("bad"),
        "w8a8",
        &["--calibration", config.to_str().unwrap()],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!("--calibration {}", config.display()))
            && text.contains("expected a `pi0d infer` inputs file"),
        "{text}"
    );
    assert!(!dir.join("bad").exists());
    // Another model's inputs: the refusal says why this model cannot run them.
    let other = root().join("tests/fixtures/cases/pi05_f32_1cam/inputs.safetensors");
    let (code, text) = quantize(
        &model,
        &dir.join("bad"),
        "w8",
        &["--calibration", other.to_str().unwrap()],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("expected a `pi0d infer` inputs file for this checkpoint")
            && text.contains("200 prompt tokens, the model takes at most 48"),
        "{text}"
    );
    assert!(!dir.join("bad").exists());
}

#[test]
fn when_quantize_is_calibrated_on_a_recording_expect_its_observations_run_and_a_cut_file_refused() {
    let dir = scratch_dir("quantized-recorded");
    let recording = dir.join("run.mcap");
    let cfg = recording_config(&recording);
    let run = run_daemon("quantized-recorded", &cfg, 3.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let model = root().join("models/tiny-pi0");
    let out = dir.join("w8a8");
    let (code, text) = quantize(
        &model,
        &out,
        "w8a8",
        &["--calibration", recording.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("calibrated on 1 input file(s), "), "{text}");
    assert!(
        text.contains(&format!(
            "calibration: running the float model on {} (",
            recording.display()
        )) && text.contains(" observations)"),
        "{text}"
    );
    let manifest = manifest(&out);
    assert!(
        !manifest["smoothing"].as_object().unwrap().is_empty(),
        "every layer saw the recorded observations: {manifest}"
    );
    // Each recorded frame is an observation, counted in the manifest.
    let observations: u64 = text
        .split(&format!(
            "running the float model on {} (",
            recording.display()
        ))
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the observation count");
    assert_eq!(manifest["observations"], observations, "{manifest}");
    // The recording's head alone (no frame, no metadata): refused naming it.
    let cut = dir.join("cut.mcap");
    let bytes = std::fs::read(&recording).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len().min(600)]).unwrap();
    let (code, text) = quantize(
        &model,
        &dir.join("cut-out"),
        "w4",
        &["--calibration", cut.to_str().unwrap()],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!("--calibration {}", cut.display())),
        "{text}"
    );
    assert!(!dir.join("cut-out").exists());
}
