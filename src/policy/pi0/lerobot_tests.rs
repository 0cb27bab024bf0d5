//! The policy path around the model against lerobot's own processors (tools/make_golden.py):
//! frame preprocessing, prompt tokenization, state normalization (and pi0.5's discretized-state
//! prompt), and the whole raw-observation-to-actions path for pi0 and pi0.5.

use std::path::{Path, PathBuf};

use super::pipeline::{Pi0Pipeline, PipelineOptions};
use super::preprocess::{frame_to_model_input, resize_with_pad};
use super::tensorfile::{TensorFile, Values};
use crate::config::BackendOptions;
use crate::config::CameraSource;
use crate::observation::{CameraFrame, PixelFormat};
use crate::policy::cameras::{bind, ModelCameras};
use crate::time::MonoTime;

pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub(crate) fn u8s(f: &TensorFile, name: &str) -> (Vec<usize>, Vec<u8>) {
    let t = &f.tensors[name];
    match &t.values {
        Values::U8(v) => (t.shape.clone(), v.clone()),
        _ => panic!("{name} is not u8"),
    }
}

pub(crate) fn rgb_frame(shape: &[usize], data: Vec<u8>) -> CameraFrame {
    CameraFrame {
        stamp: MonoTime::ZERO,
        width: shape[1] as u32,
        height: shape[0] as u32,
        format: PixelFormat::Rgb8,
        data,
    }
}

#[test]
fn when_non_square_uint8_frame_expect_lerobot_resize_with_pad_within_1e5() {
    let f = TensorFile::read(&fixtures().join("preprocess/resize_with_pad.safetensors")).unwrap();
    let (shape, data) = u8s(&f, "frame_rgb8");
    let (_, want) = f
        .f32("expected_chw", &[Some(3), Some(224), Some(224)])
        .unwrap();
    let got = frame_to_model_input(&rgb_frame(&shape, data), 224).unwrap();
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err <= 1e-5, "max abs error {err}");
    // The padding rows (top and bottom for a wide frame) are -1.
    assert_eq!(got[0], -1.0);
}

#[test]
fn when_frame_is_bgr_or_mono_expect_same_as_rgb_equivalent() {
    let (w, h) = (40, 30);
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 256) as u8).collect();
    let bgr: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[2], p[1], p[0]]).collect();
    let frame = |format, data| CameraFrame {
        stamp: MonoTime::ZERO,
        width: w as u32,
        height: h as u32,
        format,
        data,
    };
    let a = frame_to_model_input(&frame(PixelFormat::Rgb8, rgb.clone()), 224).unwrap();
    let b = frame_to_model_input(&frame(PixelFormat::Bgr8, bgr), 224).unwrap();
    assert_eq!(a, b);
    let mono: Vec<u8> = (0..w * h).map(|i| (i % 256) as u8).collect();
    let grey: Vec<u8> = mono.iter().flat_map(|v| [*v, *v, *v]).collect();
    let c = frame_to_model_input(&frame(PixelFormat::Mono8, mono), 224).unwrap();
    let d = frame_to_model_input(&frame(PixelFormat::Rgb8, grey), 224).unwrap();
    assert_eq!(c, d);
    let short = frame(PixelFormat::Rgb8, vec![0; 10]);
    assert!(frame_to_model_input(&short, 224)
        .unwrap_err()
        .to_string()
        .contains("needs 3600 bytes, found 10"));
    // Already square at model size: values pass through as x*2-1.
    let sq: Vec<f32> = (0..3 * 224 * 224)
        .map(|i| (i % 255) as f32 / 255.0)
        .collect();
    let out = resize_with_pad(&sq, 224, 224, 224).unwrap();
    assert!(out
        .iter()
        .zip(&sq)
        .all(|(o, s)| (o - (s * 2.0 - 1.0)).abs() < 1e-6));
}

fn pipeline(checkpoint: &str) -> Pi0Pipeline {
    pipeline_on(checkpoint, BackendOptions::Cpu)
}

fn pipeline_on(checkpoint: &str, backend: BackendOptions) -> Pi0Pipeline {
    Pi0Pipeline::load(&PipelineOptions {
        checkpoint: fixtures().join(checkpoint),
        arch: None,
        tokenizer: None,
        threads: 2,
        backend,
        openpi_delta_actions: None,
    })
    .unwrap()
}

#[test]
fn when_prompt_tokenized_expect_ids_identical_to_python_tokenizer() {
    let p = pipeline("pi0_float32");
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer/cases.json")).unwrap(),
    )
    .unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 6);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let (ids, mask) = p.tokenize(text).unwrap();
        let want_ids: Vec<i64> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        let want_mask: Vec<bool> = c["mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() != 0)
            .collect();
        assert_eq!(ids, want_ids, "{text:?}");
        assert_eq!(mask, want_mask, "{text:?}");
    }
}

fn end_to_end(kind: &str) {
    end_to_end_on(kind, |_| BackendOptions::Cpu);
}

fn end_to_end_on(kind: &str, backend: impl Fn(&Path) -> BackendOptions) {
    end_to_end_with(kind, backend, false)
}

/// `swapped`: the observation holds the cameras in the other order, and the cameras are bound
/// by the checkpoint's names (`cam0`, `cam1` in its config.json; `cam2` optional and absent)
/// as `[ros.cameras]` and `policy.optional_cameras` would.
fn end_to_end_with(kind: &str, backend: impl Fn(&Path) -> BackendOptions, swapped: bool) {
    let dir = fixtures().join("cases").join(format!("{kind}_end_to_end"));
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let checkpoint = case["checkpoint"].as_str().unwrap();
    let mut p = pipeline_on(checkpoint, backend(&fixtures().join(checkpoint)));
    let raw = TensorFile::read(&dir.join("raw.safetensors")).unwrap();
    let frames: Vec<CameraFrame> = (0..)
        .map_while(|i| raw.tensors.contains_key(&format!("frame{i}")).then_some(i))
        .map(|i| {
            let (shape, data) = u8s(&raw, &format!("frame{i}"));
            rgb_frame(&shape, data)
        })
        .collect();
    let (_, state) = raw.f32("state", &[Some(7)]).unwrap();
    let (_, noise) = raw.f32("noise", &[Some(1), Some(50), Some(32)]).unwrap();
    let task = case["task"].as_str().unwrap();

    // Normalization and tokens match lerobot's preprocessor on their own.
    let (_, want_state) = raw.f32("normalized_state", &[Some(1), None]).unwrap();
    let norm = p.preprocess(state, task).unwrap().state;
    let nerr = norm
        .iter()
        .zip(want_state)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(nerr <= 1e-5, "{kind}: normalization error {nerr}");
    let (_, want_tokens) = raw.i64("lang_tokens", &[Some(1), None]).unwrap();
    let (tokens, _) = p.tokenize(&p.prompt(task, state)).unwrap();
    assert_eq!(tokens, want_tokens, "{kind}: prompt tokens");

    let mut refs: Vec<Option<&CameraFrame>> = frames.iter().map(Some).collect();
    if swapped {
        // The checkpoint has a third camera, not in the observation (lerobot masks it).
        assert_eq!(p.camera_names, ["cam0", "cam1", "cam2"]);
        refs.reverse();
        let sources: Vec<CameraSource> = ["cam1", "cam0"]
            .iter()
            .map(|n| CameraSource {
                model_name: Some(n.to_string()),
                shown: format!("ros.cameras.{n}"),
            })
            .collect();
        let model = ModelCameras {
            names: &p.camera_names,
            count: p.cameras,
            source: "config.json",
            renames: &Default::default(),
        };
        assert!(bind(&model, &sources, &[]).is_err(), "cam2 has no source");
        let slots = bind(&model, &sources, &["cam2".into()]).unwrap();
        assert_eq!(slots, [Some(1), Some(0), None]);
        p.set_camera_slots(slots);
    }
    let (actions, _) = p.run(&refs, state, task, noise).unwrap();
    let want = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
    let (_, want) = want.f32("actions", &[Some(1), Some(50), Some(7)]).unwrap();
    let got: Vec<f32> = actions.into_iter().flatten().collect();
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err <= 1e-4, "{kind}: max abs error {err}");
}

#[test]
fn when_raw_observation_expect_pi0_actions_as_lerobot_pipeline() {
    end_to_end("pi0");
}

#[test]
fn when_cameras_arrive_in_another_order_but_are_bound_by_name_expect_the_same_actions() {
    end_to_end_with("pi0", |_| BackendOptions::Cpu, true);
}

/// The hardware-in-the-loop task's trained checkpoint (models/hil-above-cube: 112-pixel
/// images, the dataset's stats) on its own scene's camera frame at the start pose: the
/// actions lerobot's pipeline gives (tools/hil_task.py golden).
#[test]
fn when_the_trained_hil_task_checkpoint_sees_its_scene_expect_lerobots_actions() {
    end_to_end("hil_above_cube");
}

#[test]
fn when_raw_observation_expect_pi05_actions_as_lerobot_pipeline() {
    end_to_end("pi05");
}

/// The same raw observations through graphs `pi0d export` wrote, on ONNX Runtime.
#[cfg(feature = "onnx")]
#[test]
fn when_raw_observation_through_onnx_graphs_expect_lerobot_pipeline_actions() {
    use crate::config::OnnxOptions;
    use crate::policy::export::{export, ExportOptions};
    for kind in ["pi0", "pi05"] {
        let out = crate::test_dirs::TempDir::new(&format!("test-pipeline-onnx-{kind}"));
        end_to_end_on(kind, |checkpoint| {
            export(&ExportOptions::new(
                checkpoint.to_path_buf(),
                out.to_path_buf(),
                2,
            ))
            .unwrap();
            BackendOptions::Onnx {
                model_dir: out.to_path_buf(),
                options: OnnxOptions {
                    library: Some(crate::test_dirs::ort_library()),
                    ..Default::default()
                },
            }
        });
    }
}

#[test]
fn when_bundled_model_sees_the_sim_start_pose_expect_actions_near_it() {
    let mut p = Pi0Pipeline::load(&PipelineOptions {
        checkpoint: Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-pi0"),
        arch: None,
        tokenizer: None,
        threads: 1,
        backend: BackendOptions::Cpu,
        openpi_delta_actions: None,
    })
    .unwrap();
    assert_eq!((p.state_dim, p.action_dim, p.cameras), (7, 7, 1));
    let start = [0.0f32, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02];
    let frame = rgb_frame(
        &[240, 320],
        (0..240 * 320 * 3).map(|i| (i % 251) as u8).collect(),
    );
    let noise: Vec<f32> = (0..50 * 32)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let (actions, _) = p
        .run(&[Some(&frame)], &start, "pick up the red cube", &noise)
        .unwrap();
    for (i, a) in actions.iter().enumerate() {
        for j in 0..7 {
            let d = (a[j] - start[j]).abs();
            assert!(
                d < if j == 6 { 0.002 } else { 0.05 },
                "step {i} joint {j}: {} vs start {}",
                a[j],
                start[j]
            );
        }
    }
}

/// A pi0.5 trained for real-time chunking (`rtc_training_max_delay` 8 in its config.json,
/// lerobot after 0.6.1): a leftover conditions it as it was trained (its first `d` actions
/// clamped to the leftover at flow time 0), matched against lerobot's trained mode
/// (tools/make_golden_rtc_trained.py, lerobot pinned at 15b19df). Plain sampling (d = 0, the first
/// chunk) is lerobot's plain chunk.
#[test]
fn when_a_pi05_trained_for_rtc_gets_a_leftover_expect_lerobots_trained_mode_actions() {
    use super::checkpoint::Checkpoint;
    use super::infer::{run_batch, Batch};
    use super::model::Pi0Model;
    let ck = Checkpoint::load(&fixtures().join("pi05_float32_rtc8")).unwrap();
    let model = Pi0Model::load(&ck, None, 2).unwrap();
    assert_eq!(model.trained_rtc, Some(8));
    for case in [
        "pi05_f32_rtc_trained_d0_first",
        "pi05_f32_rtc_trained_d3",
        "pi05_f32_rtc_trained_d5_full",
        "pi05_f32_rtc_trained_d8_batch2",
    ] {
        let dir = fixtures().join("cases").join(case);
        let inputs = TensorFile::read(&dir.join("inputs.safetensors")).unwrap();
        let (_, d) = inputs.i64("rtc_inference_delay", &[]).unwrap();
        let d = d[0] as usize;
        let (lshape, leftover) = inputs.f32("rtc_prev_chunk", &[None, None, None]).unwrap();
        let batch = Batch::read(&dir.join("inputs.safetensors"), &model).unwrap();
        let (actions, _) = run_batch(&model, &batch);
        let want = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
        let (_, want) = want.f32("actions", &[None, Some(50), Some(32)]).unwrap();
        assert_eq!(actions.len(), want.len());
        // Per-token time changes the new steps by only ~1e-4 in this tiny model: the bound is
        // tight enough to tell (a single step's velocity is checked on its own below).
        let err = actions
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-5, "{case}: max abs error {err}");
        // The first d steps are the leftover, exactly; beyond its width, 0.
        let (steps, width) = (lshape[1], lshape[2]);
        for b in 0..lshape[0] {
            for i in 0..d {
                for j in 0..32 {
                    let got = actions[(b * 50 + i) * 32 + j];
                    let want = if j < width {
                        leftover[(b * steps + i) * width + j]
                    } else {
                        0.0
                    };
                    assert_eq!(got, want, "{case}: batch {b} step {i} action {j}");
                }
            }
        }
    }
}

/// One denoising step of the trained mode against lerobot's own (the per-step trace): the
/// clamped tokens run at flow time 0, which moves their velocity by ~0.1 against the step's
/// time (forgetting it would show here, where the final actions hardly move).
#[test]
fn when_a_trained_rtc_step_runs_expect_lerobots_velocity_with_the_clamped_tokens_at_time_zero() {
    use super::checkpoint::Checkpoint;
    use super::infer::Batch;
    use super::model::{Pi0Model, Workspace};
    let ck = Checkpoint::load(&fixtures().join("pi05_float32_rtc8")).unwrap();
    let model = Pi0Model::load(&ck, None, 2).unwrap();
    let dir = fixtures().join("cases/pi05_f32_rtc_trained_d3");
    let batch = Batch::read(&dir.join("inputs.safetensors"), &model).unwrap();
    let trace = TensorFile::read(&dir.join("trace.safetensors")).unwrap();
    let (_, x_t) = trace
        .f32("x_t", &[Some(10), Some(1), Some(50), Some(32)])
        .unwrap();
    let (_, time) = trace.f32("time", &[Some(10), Some(1), Some(50)]).unwrap();
    let (_, v_t) = trace
        .f32("v_t", &[Some(10), Some(1), Some(50), Some(32)])
        .unwrap();
    let input = batch.element(0);
    let cache = model.prefix(&input);
    let mut ws = Workspace::default();
    model.prepare_steps(&cache, &mut ws);
    let per = 50 * 32;
    for step in [0, 4, 9] {
        let t = time[step * 50 + 49];
        assert!(time[step * 50..step * 50 + 3].iter().all(|x| *x == 0.0));
        let mut v = vec![0.0f32; per];
        let x = &x_t[step * per..(step + 1) * per];
        model.denoise_batch_step(&cache, &[input.state], x, t, &[3], &mut ws, &mut v);
        let err = v
            .iter()
            .zip(&v_t[step * per..(step + 1) * per])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-4, "step {step}: max abs error {err}");
    }
}

/// A pi0.5 trained for real-time chunking as exported graphs on ONNX Runtime, looped (the host
/// clamps between runs) and unrolled (the graph clamps): the graphs run the clamped tokens at
/// time 0 and give lerobot's trained-mode actions; `--rtc` (guidance inputs) is refused for it.
#[cfg(feature = "onnx")]
#[test]
fn when_graphs_of_a_checkpoint_trained_for_rtc_run_expect_lerobots_trained_mode_actions() {
    use super::infer::{Batch, BatchDims};
    use crate::config::OnnxOptions;
    use crate::policy::export::{export, ExportOptions};
    use crate::policy::graph::load_onnx;
    use crate::policy::graph::manifest::Manifest;
    let ck = fixtures().join("pi05_float32_rtc8");
    let mut worst = 0.0f32;
    for unroll in [false, true] {
        for (cameras, batch, cases) in [
            (
                1,
                1,
                &[
                    "pi05_f32_rtc_trained_d0_first",
                    "pi05_f32_rtc_trained_d3",
                    "pi05_f32_rtc_trained_d5_full",
                ][..],
            ),
            (2, 2, &["pi05_f32_rtc_trained_d8_batch2"][..]),
        ] {
            let out =
                crate::test_dirs::TempDir::new(&format!("trained-rtc-graphs-{unroll}-{batch}"));
            let mut opts = ExportOptions::new(ck.clone(), out.to_path_buf(), cameras);
            opts.batch = batch;
            opts.unroll = unroll;
            export(&opts).unwrap();
            let m = Manifest::load(&out).unwrap();
            assert_eq!(m.trained_rtc, Some(8));
            let dims = BatchDims {
                image_size: m.image_size,
                state_dim: m.state_dim,
                chunk: m.chunk,
                action_dim: m.action_dim,
            };
            let mut g = load_onnx(
                &out,
                m,
                &OnnxOptions {
                    library: Some(crate::test_dirs::ort_library()),
                    ..Default::default()
                },
            )
            .unwrap();
            for case in cases {
                let dir = fixtures().join("cases").join(case);
                let mut b = Batch::read_for(&dir.join("inputs.safetensors"), &dims).unwrap();
                b.condition_as_trained(8).unwrap();
                let (actions, _) = g.sample(&b.graph_inputs()).unwrap();
                let want = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
                let (_, want) = want.f32("actions", &[None, Some(50), Some(32)]).unwrap();
                let err = actions
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                worst = worst.max(err);
                assert!(
                    err <= 1e-5,
                    "{case} (unrolled {unroll}): max abs error {err}"
                );
            }
        }
    }
    eprintln!("graphs of a checkpoint trained for RTC: max abs error {worst:e}");
    let out = crate::test_dirs::TempDir::new("trained-rtc-graphs-rtc");
    let mut opts = ExportOptions::new(ck, out.to_path_buf(), 1);
    opts.unroll = true;
    opts.rtc = true;
    let e = export(&opts)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("--rtc") && e.contains("rtc_training_max_delay = 8"),
        "{e}"
    );
}

/// The pipeline conditions a trained checkpoint on the leftover (robot units, normalized as the
/// model's actions are) instead of guiding it, and refuses a delay beyond what it was trained on,
/// as lerobot's sampler refuses it.
#[test]
fn when_the_pipeline_conditions_a_trained_checkpoint_expect_a_clamped_prefix_within_its_maximum() {
    use crate::chunk::ChunkPrefix;
    use crate::policy::rtc::{Conditioning, RtcSettings};
    let p = pipeline("pi05_float32_rtc8");
    assert_eq!(p.trained_rtc(), Some(8));
    let prefix = |d| ChunkPrefix {
        actions: vec![0.1; 20 * 7],
        action_dim: 7,
        inference_delay: d,
        execution_horizon: 10,
    };
    let state = [0.0f32; 7];
    match p.conditioning(RtcSettings::default(), &prefix(5), &state) {
        Ok(Conditioning::Trained(c)) => assert_eq!(c.delay(), 5),
        other => panic!("{other:?}"),
    }
    let e = p
        .conditioning(RtcSettings::default(), &prefix(9), &state)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("9 steps, more than the 8 the model was trained to take"),
        "{e}"
    );
    // An untrained checkpoint is guided.
    let g = pipeline("pi05_float32").conditioning(RtcSettings::default(), &prefix(5), &state);
    assert!(matches!(g, Ok(Conditioning::Guided(_))), "{g:?}");
}
