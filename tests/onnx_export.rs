//! `pi0d export` graphs run on the real ONNX Runtime (the `onnxruntime` wheel's library from the
//! test venv, loaded by the `ort` crate) against lerobot's golden actions, and checked by the
//! `onnx` package's checker.

#![cfg(feature = "onnx")]

#[path = "onnx_export/activations.rs"]
mod activations;
mod common;
#[path = "onnx_export/quant.rs"]
mod quant;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{
    assert_safe, edited_checkpoint, max_diff, ort_library, recording_config, root, run_daemon,
    scratch_dir, sim_model_config, wide_mlp_checkpoint, with_backend,
};
use pi0d::config::OnnxOptions;
use pi0d::policy::export::atc::{unsupported_ops, ATC_OPS};
use pi0d::policy::export::pi0::ExportDtype;
use pi0d::policy::export::{export, read_model, ExportError, ExportOptions, ExternalData};
use pi0d::policy::graph::manifest::Manifest;
use pi0d::policy::graph::{load_onnx, load_onnx_probed, GraphError, GraphModel, GraphRuntime};
use pi0d::policy::pi0::infer::{Batch, BatchDims};
use pi0d::policy::pi0::tensorfile::TensorFile;

fn python() -> PathBuf {
    root().join(".venv/bin/python")
}

fn case_dir(case: &str) -> PathBuf {
    root().join("tests/fixtures/cases").join(case)
}

fn case_checkpoint(case: &str) -> PathBuf {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("case.json")).unwrap())
            .unwrap();
    root()
        .join("tests/fixtures")
        .join(json["checkpoint"].as_str().unwrap())
}

/// Export options with the static sizes of a golden case's inputs.
fn options_for(case: &str, out: &Path, dtype: ExportDtype, unroll: bool) -> ExportOptions {
    let inputs = TensorFile::read(&case_dir(case).join("inputs.safetensors")).unwrap();
    let cameras = (0..)
        .take_while(|i| inputs.tensors.contains_key(&format!("image{i}")))
        .count();
    let (shape, _) = inputs.i64("lang_tokens", &[None, None]).unwrap();
    ExportOptions {
        batch: shape[0],
        prompt_len: Some(shape[1]),
        dtype,
        unroll,
        ..ExportOptions::new(case_checkpoint(case), out.to_path_buf(), cameras)
    }
}

/// The exported graphs in `dir` on ONNX Runtime (`probed`: measuring their activations), and a
/// case's inputs for them.
fn graphs_for(dir: &Path, case: &str, probed: bool) -> (GraphModel<Box<dyn GraphRuntime>>, Batch) {
    let m = Manifest::load(dir).unwrap();
    let batch = Batch::read_for(
        &case_dir(case).join("inputs.safetensors"),
        &BatchDims {
            image_size: m.image_size,
            state_dim: m.state_dim,
            chunk: m.chunk,
            action_dim: m.action_dim,
        },
    )
    .unwrap();
    let opts = OnnxOptions {
        library: Some(ort_library()),
        threads: 2,
        ..Default::default()
    };
    let load = if probed { load_onnx_probed } else { load_onnx };
    (load(dir, m, &opts).unwrap(), batch)
}

/// Runs the exported graphs in `dir` on a case's inputs.
fn run_graphs(dir: &Path, case: &str) -> Vec<f32> {
    let (mut model, batch) = graphs_for(dir, case, false);
    model.sample(&batch.graph_inputs()).unwrap().0
}

fn expected(case: &str) -> Vec<f32> {
    let f = TensorFile::read(&case_dir(case).join("expected.safetensors")).unwrap();
    let (_, v) = f.f32("actions", &[None, None, None]).unwrap();
    assert!(
        v.iter().any(|x| x.abs() > 0.5),
        "{case}: reference too close to zero to tell anything"
    );
    v.to_vec()
}

/// Exports `case` as given and returns the max error against lerobot's actions.
fn export_and_compare(case: &str, dtype: ExportDtype, unroll: bool) -> (f32, common::TempDir) {
    let tag = format!("{case}-{dtype:?}-{unroll}");
    let dir = scratch_dir(&format!("onnx-{tag}"));
    let report = export(&options_for(case, &dir, dtype, unroll)).unwrap();
    assert!(report.clamped.is_empty());
    let err = max_diff(&run_graphs(&dir, case), &expected(case));
    eprintln!("{tag}: max abs error {err:.3e}");
    (err, dir)
}

/// `onnx.checker.check_model(full_check=True)` on every graph of an export.
fn onnx_check(dir: &Path) {
    let m = Manifest::load(dir).unwrap();
    for g in [&m.graphs.prefix, &m.graphs.denoise] {
        let path = dir.join(&g.file);
        let out = Command::new(python())
            .args([
                "-c",
                "import sys, onnx; onnx.checker.check_model(sys.argv[1], full_check=True); m = onnx.load(sys.argv[1]); print(m.opset_import[0].version, len(m.graph.node))",
            ])
            .arg(&path)
            .output()
            .expect("the test venv's python (./tools/test.sh makes it)");
        assert!(
            out.status.success(),
            "onnx.checker rejected {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.trim(),
            format!("13 {}", g.nodes),
            "{}",
            path.display()
        );
    }
}

#[test]
fn when_pi0_f32_graphs_run_on_onnxruntime_expect_lerobot_actions_within_1e4() {
    for case in [
        "pi0_f32_1cam_short",
        "pi0_f32_2cam_batch2",
        "pi0_f32_3cam_masked",
    ] {
        let (err, dir) = export_and_compare(case, ExportDtype::F32, false);
        assert!(err <= 1e-4, "{case}: max abs error {err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn when_pi05_f32_graphs_run_expect_lerobot_actions_within_1e4() {
    for case in ["pi05_f32_1cam", "pi05_f32_2cam_batch2"] {
        let (err, dir) = export_and_compare(case, ExportDtype::F32, false);
        assert!(err <= 1e-4, "{case}: max abs error {err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn when_f16_graphs_run_expect_lerobot_f32_actions_within_3e2() {
    for case in ["pi0_f32_2cam_batch2", "pi05_f32_1cam"] {
        let (err, dir) = export_and_compare(case, ExportDtype::F16, false);
        assert!(err <= 3e-2, "{case}: f16 max abs error {err}");
        // f16 is really in use: the weights take half the bytes of the f32 export.
        let m = Manifest::load(&dir).unwrap();
        assert_eq!(m.mask_value, -30000.0);
        let model = read_model(&dir.join(&m.graphs.denoise.file)).unwrap();
        let graph = model.graph.unwrap();
        assert!(graph
            .initializer
            .iter()
            .any(|t| t.name.ends_with("q_proj+3parts.weight") && t.data_type == 10));
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn when_bf16_checkpoint_exported_expect_lerobot_bf16_actions_within_2e2() {
    // lerobot computed this reference in bf16; the graphs store bf16 and compute in f32.
    let (err, dir) = export_and_compare("pi0_bf16_2cam", ExportDtype::Bf16, false);
    assert!(err <= 2e-2, "bf16 max abs error {err}");
    let _ = std::fs::remove_dir_all(dir);
    let (err, dir) = export_and_compare("pi0_bf16_2cam", ExportDtype::F32, false);
    assert!(
        err <= 2e-2,
        "bf16 checkpoint, f32 graphs: max abs error {err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn when_steps_unrolled_expect_same_actions_as_the_loop() {
    for case in ["pi0_f32_2cam_batch2", "pi05_f32_1cam"] {
        let (err_unrolled, unrolled) = export_and_compare(case, ExportDtype::F32, true);
        assert!(
            err_unrolled <= 1e-4,
            "{case}: unrolled error {err_unrolled}"
        );
        let looped = scratch_dir(&format!("onnx-loop-{case}"));
        export(&options_for(case, &looped, ExportDtype::F32, false)).unwrap();
        let a = run_graphs(&unrolled, case);
        let b = run_graphs(&looped, case);
        assert!(max_diff(&a, &b) <= 1e-5, "{case}: {}", max_diff(&a, &b));
        let m = Manifest::load(&unrolled).unwrap();
        assert!(m.unrolled);
        assert_eq!(m.graphs.denoise.file, "denoise_unrolled.onnx");
        // The unrolled graph has every step's nodes, and only one copy of the weights.
        let step = Manifest::load(&looped).unwrap();
        assert!(m.graphs.denoise.nodes > 9 * step.graphs.denoise.nodes);
        assert_eq!(
            m.graphs.denoise.weight_bytes,
            step.graphs.denoise.weight_bytes
        );
        let _ = std::fs::remove_dir_all(unrolled);
        let _ = std::fs::remove_dir_all(looped);
    }
}

#[test]
fn when_weights_external_expect_data_file_and_same_actions() {
    let case = "pi0_f32_1cam_short";
    let dir = scratch_dir("onnx-external");
    let mut opts = options_for(case, &dir, ExportDtype::F32, false);
    opts.external = ExternalData::Always;
    let m = export(&opts).unwrap().manifest;
    let data = m
        .graphs
        .prefix
        .external_data
        .clone()
        .expect("external data");
    let data_len = std::fs::metadata(dir.join(&data)).unwrap().len();
    assert!(data_len >= m.graphs.prefix.weight_bytes / 2);
    // The .onnx holds the structure only.
    let onnx_len = std::fs::metadata(dir.join(&m.graphs.prefix.file))
        .unwrap()
        .len();
    assert!(onnx_len < data_len, "{onnx_len} vs {data_len}");
    let err = max_diff(&run_graphs(&dir, case), &expected(case));
    assert!(err <= 1e-4, "{err}");
    onnx_check(&dir);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn when_graphs_checked_expect_onnx_checker_passes_and_only_atc_operators() {
    let variants = [
        ("pi0_f32_3cam_masked", ExportDtype::F32, false),
        ("pi05_f32_1cam", ExportDtype::F16, true),
        ("pi0_bf16_2cam", ExportDtype::Bf16, false),
    ];
    for (case, dtype, unroll) in variants {
        let dir = scratch_dir(&format!("onnx-check-{case}"));
        let m = export(&options_for(case, &dir, dtype, unroll))
            .unwrap()
            .manifest;
        onnx_check(&dir);
        for g in [&m.graphs.prefix, &m.graphs.denoise] {
            let model = read_model(&dir.join(&g.file)).unwrap();
            assert_eq!(unsupported_ops(&model), vec![], "{}", g.file);
            assert_eq!(model.graph.as_ref().unwrap().node.len(), g.nodes);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
    // The check itself finds operators off the list.
    let dir = scratch_dir("onnx-check-ops");
    let m = export(&options_for(
        "pi0_f32_1cam_short",
        &dir,
        ExportDtype::F32,
        false,
    ))
    .unwrap()
    .manifest;
    let mut model = read_model(&dir.join(&m.graphs.prefix.file)).unwrap();
    let graph = model.graph.as_mut().unwrap();
    graph.node[0].op_type = "LayerNormalization".into();
    graph.node[1].domain = "com.microsoft".into();
    let bad = unsupported_ops(&model);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(!ATC_OPS.contains(&"LayerNormalization"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn when_f16_weight_overflows_expect_refusal_naming_it_or_clamp_report() {
    let ck = edited_checkpoint("f16-overflow", |t| {
        let (_, _, _, bytes) = t
            .iter_mut()
            .find(|(n, ..)| n.ends_with("action_out_proj.weight"))
            .unwrap();
        bytes[..4].copy_from_slice(&1.0e6f32.to_le_bytes());
    });
    let dir = scratch_dir("onnx-f16-overflow");
    let mut opts = options_for("pi0_f32_1cam_short", &dir, ExportDtype::F16, false);
    opts.checkpoint = ck.to_path_buf();
    let err = match export(&opts) {
        Err(e) => e,
        Ok(_) => panic!("an f16 export of a 1e6 weight must be refused"),
    };
    assert!(
        matches!(err, ExportError::F16Overflow { count: 1, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("action_out_proj.weight") && msg.contains("1000000"),
        "{msg}"
    );
    opts.clamp_f16 = true;
    let report = export(&opts).unwrap();
    assert_eq!(report.clamped.len(), 1);
    assert!(report.clamped[0].tensor.contains("action_out_proj.weight"));
    // f32 export of the same checkpoint is fine.
    opts.clamp_f16 = false;
    opts.dtype = ExportDtype::F32;
    assert!(export(&opts).unwrap().clamped.is_empty());
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(ck);
}

#[test]
fn when_runtime_library_or_manifest_is_wrong_expect_clear_errors() {
    let dir = scratch_dir("onnx-errors");
    export(&options_for(
        "pi0_f32_1cam_short",
        &dir,
        ExportDtype::F32,
        false,
    ))
    .unwrap();
    let m = Manifest::load(&dir).unwrap();
    let opts = OnnxOptions {
        library: Some("/nonexistent/libonnxruntime.so.1.22.1".into()),
        ..Default::default()
    };
    let err = match load_onnx(&dir, m.clone(), &opts) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("loaded a missing library"),
    };
    assert!(
        err.contains("cannot load the ONNX Runtime library /nonexistent/"),
        "{err}"
    );
    // The hint names settings that exist: the config key, the flag and the variable.
    assert!(
        err.contains("policy.onnx.library")
            && err.contains("--onnx-library")
            && err.contains("ORT_DYLIB_PATH")
            && !err.contains("backend.onnx_library"),
        "{err}"
    );
    // Inputs not matching the exported static shapes are refused before any run.
    let opts = OnnxOptions {
        library: Some(ort_library()),
        ..Default::default()
    };
    let mut model = load_onnx(&dir, m, &opts).unwrap();
    let batch = Batch::read_for(
        &case_dir("pi0_f32_2cam_batch2").join("inputs.safetensors"),
        &BatchDims {
            image_size: 224,
            state_dim: 32,
            chunk: 50,
            action_dim: 32,
        },
    )
    .unwrap();
    match model.sample(&batch.graph_inputs()) {
        Err(GraphError::Input { message, .. }) => {
            assert!(message.contains("exported for 1"), "{message}")
        }
        other => panic!("expected an input error, got {:?}", other.map(|_| ())),
    }
    // A manifest that does not add up is refused, naming the file.
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("\"prefix_len\": 304", "\"prefix_len\": 305"),
    )
    .unwrap();
    let err = Manifest::load(&dir).unwrap_err().to_string();
    assert!(
        err.contains("manifest.json")
            && err.contains(
                "`prefix_len`: expected 304 (1 cameras x 256 tokens + 48 prompt tokens), found 305"
            ),
        "{err}"
    );
    std::fs::write(&path, text.replace("pi0d-graphs/1", "pi0d-graphs/9")).unwrap();
    let err = Manifest::load(&dir).unwrap_err().to_string();
    assert!(err.contains("pi0d-graphs/9"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn when_cli_exports_and_infers_expect_lerobot_actions_and_atc_commands() {
    let dir = scratch_dir("onnx-cli");
    let bin = env!("CARGO_BIN_EXE_pi0d");
    let case = "pi0_f32_3cam_masked";
    let out = Command::new(bin)
        .args([
            "export",
            "--cameras",
            "3",
            "--atc",
            "Ascend310P1",
            "--checkpoint",
        ])
        .arg(case_checkpoint(case))
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "atc --model={}/prefix.onnx --framework=5 --output={}/prefix --soc_version=Ascend310P1",
            dir.display(),
            dir.display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("denoise_step.onnx"), "{stdout}");
    let actions = dir.join("actions.safetensors");
    let out = Command::new(bin)
        .args(["infer", "--backend", "onnx", "--repeat", "2", "--model-dir"])
        .arg(&dir)
        .arg("--onnx-library")
        .arg(ort_library())
        .arg("--inputs")
        .arg(case_dir(case).join("inputs.safetensors"))
        .arg("--output")
        .arg(&actions)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let timings: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(timings.len(), 2);
    for t in &timings {
        let stage = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {t}"));
        let sum = stage("preprocess_ms")
            + stage("prefix_ms")
            + stage("steps_ms")
            + stage("postprocess_ms");
        assert!(
            stage("total_ms") > 0.0 && (sum - stage("total_ms")).abs() < 1e-6,
            "{t}"
        );
        assert!(stage("postprocess_ms") > 0.0, "{t}");
    }
    let f = TensorFile::read(&actions).unwrap();
    let (_, got) = f.f32("actions", &[Some(1), Some(50), Some(32)]).unwrap();
    let err = max_diff(got, &expected(case));
    assert!(err <= 1e-4, "{err}");
    // A bad dtype is refused with the accepted values.
    let out = Command::new(bin)
        .args([
            "export",
            "--cameras",
            "1",
            "--dtype",
            "int8",
            "--checkpoint",
        ])
        .arg(case_checkpoint(case))
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    // A bad command line: exit 2, naming the values.
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[possible values: f32, f16, bf16]"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn when_daemon_runs_the_sim_on_onnx_graphs_expect_chunks_and_safe_motion() {
    // The embedded default's model, exported, then driving the simulated arm.
    let graphs = scratch_dir("onnx-daemon-graphs");
    export(&ExportOptions::new(
        root().join("models/tiny-pi0"),
        graphs.to_path_buf(),
        1,
    ))
    .unwrap();
    let mut cfg = sim_model_config();
    with_backend(
        &mut cfg,
        "onnx",
        &[
            (
                "model_dir",
                toml::Value::String(graphs.display().to_string()),
            ),
            (
                "library",
                toml::Value::String(ort_library().display().to_string()),
            ),
            ("threads", toml::Value::Integer(1)),
        ],
    );
    let run = run_daemon("onnx-backend", &cfg, 4.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    assert_safe(&run, &cfg);
    let s = run.summary();
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(s["chunks_rejected"], 0, "{s}");
    assert!(
        run.stderr.contains("backend=\"onnx\"") || run.stderr.contains("backend=onnx"),
        "{}",
        run.stderr
    );
    let v = s["max_abs_velocity"]["elbow"].as_f64().unwrap();
    assert!(v > 0.0 && v < 1.0, "elbow velocity {v}");
    let _ = std::fs::remove_dir_all(graphs);
}

/// `pi0d infer --backend onnx` on an RTC case with the case's schedule and cap.
fn infer_rtc(dir: &Path, case: &str) -> std::process::Output {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("case.json")).unwrap())
            .unwrap();
    Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["infer", "--backend", "onnx", "--model-dir"])
        .arg(dir)
        .arg("--onnx-library")
        .arg(ort_library())
        .arg("--inputs")
        .arg(case_dir(case).join("inputs.safetensors"))
        .arg("--output")
        .arg(dir.join("actions.safetensors"))
        .arg("--rtc-schedule")
        .arg(json["rtc_schedule"].as_str().unwrap())
        .arg("--rtc-max-guidance")
        .arg(json["rtc_max_guidance"].to_string())
        .output()
        .unwrap()
}

#[test]
fn when_rtc_leftover_given_expect_looped_graphs_to_match_lerobot_and_unrolled_refused() {
    for case in ["pi0_f32_rtc_exp_batch2", "pi05_f32_rtc_linear"] {
        let dir = scratch_dir(&format!("onnx-rtc-{case}"));
        export(&options_for(case, &dir, ExportDtype::F32, false)).unwrap();
        let out = infer_rtc(&dir, case);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = TensorFile::read(&dir.join("actions.safetensors")).unwrap();
        let (_, got) = f.f32("actions", &[None, Some(50), Some(32)]).unwrap();
        let err = max_diff(got, &expected(case));
        eprintln!("{case} on looped ONNX graphs: max abs error against lerobot's RTC {err:.1e}");
        assert!(err <= 1e-4, "{case}: {err}");
    }
    let case = "pi0_f32_rtc_linear";
    let dir = scratch_dir("onnx-rtc-unrolled");
    export(&options_for(case, &dir, ExportDtype::F32, true)).unwrap();
    let out = infer_rtc(&dir, case);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rtc_prev_chunk") && stderr.contains("--rtc"),
        "{stderr}"
    );
}

#[test]
fn when_unrolled_graphs_exported_with_rtc_expect_lerobot_guided_and_plain_actions() {
    let rtc_options = |case: &str, dir: &Path| ExportOptions {
        rtc: true,
        ..options_for(case, dir, ExportDtype::F32, true)
    };
    for case in ["pi0_f32_rtc_zeros", "pi05_f32_rtc_exp_full"] {
        let dir = scratch_dir(&format!("onnx-rtc-unrolled-{case}"));
        let report = export(&rtc_options(case, &dir)).unwrap();
        assert!(report.manifest.rtc && report.manifest.unrolled);
        let out = infer_rtc(&dir, case);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = TensorFile::read(&dir.join("actions.safetensors")).unwrap();
        let (_, got) = f.f32("actions", &[None, Some(50), Some(32)]).unwrap();
        let err = max_diff(got, &expected(case));
        eprintln!(
            "{case} on the unrolled --rtc graph: max abs error against lerobot's RTC {err:.1e}"
        );
        assert!(err <= 1e-4, "{case}: {err}");
    }
    // Without a leftover the guidance inputs are zero: lerobot's plain actions.
    let case = "pi0_f32_1cam_short";
    let dir = scratch_dir("onnx-rtc-unrolled-plain");
    export(&rtc_options(case, &dir)).unwrap();
    onnx_check(&dir);
    let err = max_diff(&run_graphs(&dir, case), &expected(case));
    assert!(err <= 1e-4, "{err}");
    // --rtc is for unrolled graphs only.
    let looped_dir = scratch_dir("onnx-rtc-looped");
    let looped = ExportOptions {
        unroll: false,
        ..rtc_options(case, &looped_dir)
    };
    match export(&looped) {
        Err(ExportError::Invalid(m)) => assert!(m.contains("--rtc goes with --unroll"), "{m}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

/// `pi0d serve`'s batches on graphs exported for batch 2: three observations run as a pair
/// and a padded single, each with the CPU model's actions for it alone.
#[test]
fn when_graphs_are_exported_for_batch_2_expect_batches_in_pairs_each_its_own_actions() {
    use pi0d::config::BackendOptions;
    use pi0d::observation::{CameraFrame, PixelFormat};
    use pi0d::policy::pi0::pipeline::{BatchItem, Pi0Pipeline, PipelineOptions};
    let ck = root().join("models/tiny-pi0");
    let dir = scratch_dir("onnx-batch2-serve");
    let mut o = ExportOptions::new(ck.clone(), dir.to_path_buf(), 1);
    o.batch = 2;
    export(&o).unwrap();
    let load = |backend| {
        Pi0Pipeline::load(&PipelineOptions {
            checkpoint: ck.clone(),
            arch: None,
            tokenizer: None,
            threads: 1,
            backend,
            openpi_delta_actions: None,
        })
        .unwrap()
    };
    let mut graphs = load(BackendOptions::Onnx {
        model_dir: dir.to_path_buf(),
        options: OnnxOptions {
            library: Some(ort_library()),
            threads: 1,
            ..Default::default()
        },
    });
    let mut cpu = load(BackendOptions::Cpu);
    let frames: Vec<CameraFrame> = (0..3u8)
        .map(|k| CameraFrame {
            stamp: pi0d::time::MonoTime::now(),
            width: 64,
            height: 48,
            format: PixelFormat::Rgb8,
            data: (0..64 * 48 * 3)
                .map(|i| (i as u8).wrapping_mul(k + 3))
                .collect(),
        })
        .collect();
    let refs: Vec<Vec<Option<&CameraFrame>>> = frames.iter().map(|f| vec![Some(f)]).collect();
    let states: Vec<Vec<f32>> = (0..3).map(|k| vec![0.1 * k as f32; 7]).collect();
    let noises: Vec<Vec<f32>> = (0..3)
        .map(|k| {
            (0..50 * 32)
                .map(|i| ((i * 7 + k * 13) % 17) as f32 / 8.0 - 1.0)
                .collect()
        })
        .collect();
    let tasks = ["pick up the cube", "open the drawer", "stack the blocks"];
    let items: Vec<BatchItem> = (0..3)
        .map(|k| BatchItem {
            frames: &refs[k],
            state: &states[k],
            task: tasks[k],
            noise: &noises[k],
            rtc: None,
        })
        .collect();
    let batched = graphs.run_batch(&items);
    assert_eq!(batched.len(), 3);
    for (k, got) in batched.into_iter().enumerate() {
        let (got, _) = got.unwrap();
        let (want, _) = cpu.run(&refs[k], &states[k], tasks[k], &noises[k]).unwrap();
        let err = got
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-4, "observation {k}: {err}");
        // Different observations, different actions: nothing was mixed up.
        if k > 0 {
            let (prev, _) = cpu
                .run(&refs[k - 1], &states[k - 1], tasks[k - 1], &noises[k - 1])
                .unwrap();
            assert_ne!(prev, want);
        }
    }
    // One observation alone on the batch-2 graphs: padded, the same actions.
    let (alone, _) = graphs
        .run(&refs[0], &states[0], tasks[0], &noises[0])
        .unwrap();
    let (want, _) = cpu.run(&refs[0], &states[0], tasks[0], &noises[0]).unwrap();
    let err = alone
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err <= 1e-4, "{err}");
}
