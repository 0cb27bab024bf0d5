//! `pi0d export --calibration`: the float model's largest activations per layer group, measured
//! on real inputs, against float16's range, and the precision the graphs need.

use super::*;
use pi0d::policy::export::atc::{F16Fit, F16_MAX};
use pi0d::policy::pi0::quant::{ActivationRange, Group};

fn with_calibration(case: &str, checkpoint: &Path, out: &Path) -> ExportOptions {
    let mut opts = options_for(case, out, ExportDtype::F32, false);
    opts.checkpoint = checkpoint.to_path_buf();
    // Another case's inputs than the graphs' own shapes come from: any inputs file fits.
    opts.calibration = vec![case_dir("pi0_f32_2cam_batch2").join("inputs.safetensors")];
    opts
}

/// The golden pi0 with its first language layer's MLP output weights a hundred thousand times
/// larger: its outputs, and the residual stream after them, pass float16's range.
fn big_language_mlp(name: &str) -> common::TempDir {
    edited_checkpoint(name, |tensors| {
        let t = tensors
            .iter_mut()
            .find(|t| {
                t.0.ends_with("language_model.layers.0.mlp.down_proj.weight")
            })
            .unwrap();
        for v in t.3.chunks_exact_mut(4) {
            let x = f32::from_le_bytes(v.try_into().unwrap()) * 1e5;
            v.copy_from_slice(&x.to_le_bytes());
        }
    })
}

#[test]
fn when_exported_with_calibration_expect_every_group_measured_and_float16_judged() {
    let case = "pi0_f32_1cam_short";
    let out = scratch_dir("activations-plain");
    let report = export(&with_calibration(case, &case_checkpoint(case), &out)).unwrap();
    let groups: Vec<Group> = report.activations.iter().map(|r| r.group).collect();
    assert_eq!(groups, Group::ALL.to_vec(), "{:?}", report.activations);
    for r in &report.activations {
        assert!(r.largest().is_finite() && r.largest() > 0.0, "{r:?}");
    }
    // The projector and heads have no norms; the towers do.
    for g in [Group::Vision, Group::Language, Group::Expert] {
        let r = report.activations.iter().find(|r| r.group == g).unwrap();
        assert!(
            r.stream > 0.0 && r.linear_in > 0.0 && r.linear_out > 0.0,
            "{r:?}"
        );
    }
    assert!(
        matches!(F16Fit::of(&report.activations), Some(F16Fit::Holds { .. })),
        "{:?}",
        report.activations
    );

    // One language layer's MLP output weights a hundred thousand times larger: its outputs,
    // and the residual stream after it, pass float16's range.
    let big = big_language_mlp("activations-big");
    let out = scratch_dir("activations-big-graphs");
    let report = export(&with_calibration(case, &big, &out)).unwrap();
    let language = report
        .activations
        .iter()
        .find(|r| r.group == Group::Language)
        .unwrap();
    assert!(language.linear_out > F16_MAX, "{language:?}");
    match F16Fit::of(&report.activations) {
        Some(F16Fit::Overflows { group, .. }) => assert_eq!(group, Group::Language),
        other => panic!("{other:?}: {:?}", report.activations),
    }
}

#[test]
fn when_activations_are_judged_expect_the_boundaries_of_float16() {
    let range = |largest: f32| pi0d::policy::pi0::quant::ActivationRange {
        group: Group::Expert,
        stream: largest,
        linear_in: 1.0,
        linear_out: 1.0,
    };
    let fit = |largest: f32| F16Fit::of(&[range(1.0), range(largest)]);
    assert_eq!(F16Fit::of(&[]), None);
    assert!(matches!(fit(F16_MAX / 16.0), Some(F16Fit::Holds { .. })));
    assert!(matches!(
        fit(F16_MAX / 16.0 * 1.001),
        Some(F16Fit::Near { .. })
    ));
    assert!(matches!(fit(F16_MAX), Some(F16Fit::Near { .. })));
    assert!(matches!(
        fit(F16_MAX * 1.001),
        Some(F16Fit::Overflows { .. })
    ));
    assert!(matches!(fit(f32::INFINITY), Some(F16Fit::Overflows { .. })));
}

/// `pi0d export --atc Ascend310B1 --calibration FILE` of `checkpoint` with `cameras`.
fn atc_export(checkpoint: &Path, cameras: &str, out: &Path, calibration: &Path) -> Output {
    atc_export_with(checkpoint, cameras, out, calibration, &[])
}

/// As `atc_export`, with `more` arguments.
fn atc_export_with(
    checkpoint: &Path,
    cameras: &str,
    out: &Path,
    calibration: &Path,
    more: &[&str],
) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["export", "--cameras", cameras, "--atc", "Ascend310B1"])
        .args(more)
        .arg("--checkpoint")
        .arg(checkpoint)
        .arg("--out")
        .arg(out)
        .arg("--calibration")
        .arg(calibration)
        .output()
        .unwrap()
}

/// The denoising steps of the graphs exported in `dir`.
fn manifest_steps(dir: &Path) -> usize {
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    m["steps"].as_u64().unwrap() as usize
}

/// The calibration inputs read back as ATC would and run on ONNX Runtime
/// (tests/peers/atc_calibration_check.py).
fn check_calibration(dir: &Path, expected: Option<&Path>) -> serde_json::Value {
    let mut cmd = Command::new(python());
    cmd.arg(root().join("tests/peers/atc_calibration_check.py"))
        .arg(dir);
    if let Some(e) = expected {
        cmd.arg("--expected").arg(e);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn when_atc_is_given_an_inputs_file_expect_both_graphs_inputs_that_reproduce_lerobots_actions() {
    let dir = scratch_dir("atc-calibration");
    let case = "pi0_f32_1cam_short";
    let inputs = case_dir(case).join("inputs.safetensors");
    let out = atc_export(&case_checkpoint(case), "1", &dir, &inputs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Both graphs are calibrated by ATC (no `origin` then).
    for (graph, file) in [("prefix", "prefix"), ("denoise", "denoise_step")] {
        let cfg = dir.join(format!("calibration/{graph}.cfg"));
        assert!(
            stdout.contains(&format!(
                "{file} --soc_version=Ascend310B1 --compression_optimize_conf={}",
                cfg.display()
            )),
            "{stdout}"
        );
        let text = std::fs::read_to_string(&cfg).unwrap();
        assert!(text.contains("infer_soc: Ascend310B1"), "{text}");
    }
    assert!(!stdout.contains("origin"), "{stdout}");
    // The prefix's first sample holds the file's own image and tokens.
    let given = TensorFile::read(&inputs).unwrap();
    let read =
        |name: &str| std::fs::read(dir.join(format!("calibration/prefix/{name}.bin"))).unwrap();
    let (_, image) = given.f32("image0", &[None, None, None, None]).unwrap();
    let got: Vec<f32> = read("image0")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, image);
    let (_, tokens) = given.i64("lang_tokens", &[None, None]).unwrap();
    let got: Vec<i64> = read("lang_tokens")
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, tokens);
    // On ONNX Runtime: the KV caches are the prefix graph's, each step's output is the next
    // sample's x_t, and the last step gives lerobot's actions.
    let expected = case_dir(case).join("expected.safetensors");
    let r = check_calibration(&dir, Some(&expected));
    let steps = manifest_steps(&dir);
    assert_eq!(r["prefix_samples"], 1, "{r}");
    assert_eq!(
        r["denoise_samples"], steps,
        "one observation: every step; {r}"
    );
    assert_eq!(r["finite"], true, "{r}");
    assert!(r["kv_error"].as_f64().unwrap() < 1e-4, "{r}");
    let chain: Vec<f64> = r["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_f64().unwrap())
        .collect();
    assert_eq!(chain.len(), steps - 1, "{r}");
    assert!(chain.iter().all(|e| *e < 1e-4), "{r}");
    assert!(r["last_vs_expected"].as_f64().unwrap() < 1e-4, "{r}");

    // Unrolled graphs with real-time chunking's inputs: one denoise sample, the noise and the
    // guidance the host computes from the file's leftover, giving lerobot's guided actions.
    let rtc = "pi0_f32_rtc_linear";
    let unrolled = dir.join("unrolled");
    let out = atc_export_with(
        &case_checkpoint(rtc),
        "1",
        &unrolled,
        &case_dir(rtc).join("inputs.safetensors"),
        &["--unroll", "--rtc"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = check_calibration(&unrolled, Some(&case_dir(rtc).join("expected.safetensors")));
    assert_eq!(r["denoise_samples"], 1, "{r}");
    assert!(r["kv_error"].as_f64().unwrap() < 1e-4, "{r}");
    assert!(r["last_vs_expected"].as_f64().unwrap() < 1e-4, "{r}");

    // ATC's calibration leaves the rest in float16: where the activations pass it, said.
    let big = big_language_mlp("atc-calibration-big");
    let out = atc_export(&big, "1", &dir.join("big"), &inputs);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the language group reaches")
            && stderr.contains("the calibrated graphs may give infinities"),
        "{stderr}"
    );
    let plain = String::from_utf8_lossy(
        &atc_export(&case_checkpoint(case), "1", &dir.join("plain"), &inputs).stderr,
    )
    .into_owned();
    assert!(!plain.contains("may give infinities"), "{plain}");

    // Another batch than the graphs': refused naming the file, nothing written.
    let other = case_dir("pi0_f32_2cam_batch2").join("inputs.safetensors");
    let out = atc_export(&case_checkpoint(case), "1", &dir.join("again"), &other);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("--calibration {}", other.display()))
            && stderr.contains("it holds a batch of 2, the graphs take 1"),
        "{stderr}"
    );
    assert!(!dir.join("again").exists());
}

#[test]
fn when_atc_is_given_a_recording_expect_its_observations_preprocessed_into_both_graphs_inputs() {
    let dir = scratch_dir("atc-recorded");
    let recording = dir.join("run.mcap");
    let cfg = recording_config(&recording);
    let run = run_daemon("atc-recorded", &cfg, 3.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let out_dir = dir.join("graphs");
    let model = root().join("models/tiny-pi0");
    let out = atc_export(&model, "1", &out_dir, &recording);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = check_calibration(&out_dir, None);
    let steps = manifest_steps(&out_dir);
    // One sample per recorded observation (at most 32); the steps spread over them.
    let n = r["prefix_samples"].as_u64().unwrap() as usize;
    assert!((2..=32).contains(&n), "{r}");
    assert_eq!(
        r["denoise_samples"].as_u64().unwrap() as usize,
        n * (32 / n).clamp(1, steps),
        "{r}"
    );
    assert!(
        stdout.contains(&format!("prefix graph: {n} sample(s)")),
        "{stdout}"
    );
    assert_eq!(r["finite"], true, "{r}");
    assert!(r["kv_error"].as_f64().unwrap() < 1e-4, "{r}");
    // Camera frames preprocessed into the model's [-1, 1].
    let range: Vec<f64> = r["image_range"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        range[0] >= -1.0 && range[1] <= 1.0 && range[0] < range[1],
        "{r}"
    );
}

/// Runs `dir`'s graphs on `case`'s inputs with every marked activation measured.
fn probed_run(dir: &Path, case: &str) -> (Result<Vec<f32>, GraphError>, Vec<ActivationRange>) {
    let (mut model, batch) = graphs_for(dir, case, true);
    let actions = model.sample(&batch.graph_inputs()).map(|(a, _)| a);
    (actions, model.activations())
}

#[test]
fn when_graphs_run_with_activations_expect_the_cpu_models_in_f32_and_float16s_overflow_in_f16() {
    // f32 graphs measure what the CPU model measures on the same inputs.
    let case = "pi0_f32_1cam_short";
    let out = scratch_dir("activations-probed-f32");
    let mut opts = with_calibration(case, &case_checkpoint(case), &out);
    opts.calibration = vec![case_dir(case).join("inputs.safetensors")];
    let cpu = export(&opts).unwrap().activations;
    let (actions, graphs) = probed_run(&out, case);
    assert!(actions.is_ok(), "{actions:?}");
    assert_eq!(graphs.len(), cpu.len(), "{graphs:?}");
    for (g, c) in graphs.iter().zip(&cpu) {
        assert_eq!(g.group, c.group);
        for (got, want) in [
            (g.stream, c.stream),
            (g.linear_in, c.linear_in),
            (g.linear_out, c.linear_out),
        ] {
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{:?}: graphs {g:?}, CPU {c:?}",
                g.group
            );
        }
    }

    // f16 graphs (weights in an external file) of a checkpoint whose first language MLP is a
    // hundred thousand times larger: the language group overflows float16 on the run itself.
    let big = big_language_mlp("activations-probed-big");
    let out16 = scratch_dir("activations-probed-f16");
    let mut opts = options_for(case, &out16, ExportDtype::F16, false);
    opts.checkpoint = big.to_path_buf();
    opts.external = ExternalData::Always;
    export(&opts).unwrap();
    let (_, graphs) = probed_run(&out16, case);
    let language = graphs.iter().find(|r| r.group == Group::Language).unwrap();
    assert!(
        language.linear_out > F16_MAX || language.linear_out.is_nan(),
        "{language:?}"
    );
    match F16Fit::of(&graphs) {
        Some(F16Fit::Overflows { group, .. }) => assert_eq!(group, Group::Language),
        other => panic!("{other:?}: {graphs:?}"),
    }
    // The vision tower comes before it and holds.
    let vision = graphs.iter().find(|r| r.group == Group::Vision).unwrap();
    assert!(vision.largest() < F16_MAX, "{vision:?}");

    // The command prints the report, then fails on the run's non-finite actions if it has any.
    let infer = |dir: &Path, backend: &str| {
        Command::new(env!("CARGO_BIN_EXE_pi0d"))
            .args([
                "infer",
                "--activations",
                "--backend",
                backend,
                "--model-dir",
            ])
            .arg(dir)
            .arg("--checkpoint")
            .arg(&big)
            .arg("--onnx-library")
            .arg(ort_library())
            .arg("--inputs")
            .arg(case_dir(case).join("inputs.safetensors"))
            .arg("--output")
            .arg(dir.join("actions.safetensors"))
            .output()
            .unwrap()
    };
    let run = infer(&out16, "onnx");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("largest activations, f16 graphs on ONNX Runtime")
            && stdout.contains("the language group reaches")
            && stdout.contains("past float16's 65504"),
        "{stdout}"
    );
    // On the CPU model there is nothing to probe: refused as a usage error.
    let run = infer(&out16, "cpu");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--activations"), "{stderr}");
}
