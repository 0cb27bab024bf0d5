//! Quantized checkpoints against lerobot's own f32 actions (the golden fixtures of
//! tools/make_golden.py), and every refusal naming what is wrong.

use std::path::{Path, PathBuf};

use super::*;
use crate::policy::pi0::infer::{run_batch, Batch};
use crate::policy::pi0::lerobot_tests::{fixtures, rgb_frame, u8s};
use crate::policy::pi0::tensorfile::TensorFile;
use crate::policy::pi0::{Checkpoint, Pi0Model};
use crate::test_dirs::TempDir;

fn options(checkpoint: &Path, out: &Path, scheme: Scheme, groups: &[Group]) -> QuantizeOptions {
    QuantizeOptions {
        checkpoint: checkpoint.into(),
        out: out.into(),
        scheme,
        block: 32,
        groups: groups.to_vec(),
        calibration: Vec::new(),
    }
}

/// Cosine similarity and largest absolute difference of two action sets.
fn compare(got: &[f32], want: &[f32]) -> (f64, f32) {
    assert_eq!(got.len(), want.len());
    let dot: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    (dot / (norm(got) * norm(want)), max)
}

/// The case's actions from `checkpoint` against lerobot's f32 ones.
fn against_lerobot(checkpoint: &Path, case: &str) -> (f64, f32) {
    let dir = fixtures().join("cases").join(case);
    let ck = Checkpoint::load(checkpoint).unwrap();
    let model = Pi0Model::load(&ck, None, 2).unwrap();
    let batch = Batch::read(&dir.join("inputs.safetensors"), &model).unwrap();
    let (actions, _) = run_batch(&model, &batch);
    let expected = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
    let (_, want) = expected.f32("actions", &[None, None, None]).unwrap();
    compare(&actions, want)
}

/// The trained HIL checkpoint (models/hil-above-cube) from `checkpoint` on its scene's camera
/// frame, whole pipeline, against the actions lerobot's pipeline gives (in the robot's units).
fn hil_against_lerobot(checkpoint: &Path) -> (f64, f32) {
    use crate::config::BackendOptions;
    use crate::observation::CameraFrame;
    use crate::policy::pi0::pipeline::{Pi0Pipeline, PipelineOptions};
    let dir = fixtures().join("cases/hil_above_cube_end_to_end");
    let mut p = Pi0Pipeline::load(&PipelineOptions {
        checkpoint: checkpoint.into(),
        arch: None,
        tokenizer: None,
        threads: 2,
        backend: BackendOptions::Cpu,
        openpi_delta_actions: None,
    })
    .unwrap();
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
    let refs: Vec<Option<&CameraFrame>> = frames.iter().map(Some).collect();
    let task = "move the gripper above the red cube";
    let (actions, _) = p.run(&refs, state, task, noise).unwrap();
    let got: Vec<f32> = actions.into_iter().flatten().collect();
    let want = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
    let (_, want) = want.f32("actions", &[Some(1), Some(50), Some(7)]).unwrap();
    compare(&got, want)
}

const HIL: &str = "../../models/hil-above-cube";

const CASES: [(&str, &str); 2] = [
    ("pi0_float32", "pi0_f32_2cam_batch2"),
    ("pi05_float32", "pi05_f32_2cam_batch2"),
];

#[test]
fn when_quantized_expect_a_quarter_or_an_eighth_of_the_bytes_and_an_error_the_test_can_see() {
    let tmp = TempDir::new("quant-bytes");
    let (checkpoint, case) = CASES[0];
    let src = fixtures().join(checkpoint);
    let (_, f32_max) = against_lerobot(&src, case);
    for (scheme, ratio) in [(Scheme::W8, 3), (Scheme::W4, 6)] {
        let out = tmp.join(scheme.name());
        let m = quantize(&options(&src, &out, scheme, &Group::ALL))
            .unwrap()
            .manifest;
        assert!(m.bytes_after * ratio < m.bytes_before, "{m:?}");
        assert_eq!(m.block, (scheme == Scheme::W4).then_some(32));
        // The f32 checkpoint's actions are far closer to lerobot's than the quantized ones:
        // the accuracy tests below measure the quantization, not noise.
        let (_, max) = against_lerobot(&out, case);
        assert!(f32_max <= 1e-4 && max > 10.0 * f32_max, "{f32_max} {max}");
    }
}

#[test]
fn when_quantized_bf16_expect_lerobot_actions_within_2e2_and_files_carried_over() {
    let tmp = TempDir::new("quant-bf16");
    let src = fixtures().join("pi0_float32");
    let out = tmp.join("bf16");
    let report = quantize(&options(&src, &out, Scheme::Bf16, &Group::ALL)).unwrap();
    assert_eq!(
        report.manifest.bytes_after * 2,
        report.manifest.bytes_before
    );
    let (cos, max) = against_lerobot(&out, "pi0_f32_2cam_batch2");
    assert!(cos >= 0.9999 && max <= 2e-2, "cosine {cos}, max {max}");
    // Everything beside the weights comes along as it was; the manifest says what was done.
    for e in std::fs::read_dir(&src).unwrap() {
        let name = e.unwrap().file_name();
        if name != "model.safetensors" {
            assert_eq!(
                std::fs::read(src.join(&name)).unwrap(),
                std::fs::read(out.join(&name)).unwrap(),
                "{name:?}"
            );
        }
    }
    let m: Manifest =
        serde_json::from_str(&std::fs::read_to_string(out.join(MANIFEST)).unwrap()).unwrap();
    assert_eq!(m, report.manifest);
    assert_eq!(m.scheme, Scheme::Bf16);
    assert_eq!(m.float_groups, Vec::<Group>::new());
}

#[test]
fn when_names_are_classified_expect_every_linear_layer_in_a_group_and_nothing_else() {
    for checkpoint in ["pi0_float32", "pi05_float32"] {
        let ck = Checkpoint::load(&fixtures().join(checkpoint)).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for e in ck.entries() {
            let group = Group::of(&e.name);
            let linear = e.shape.len() == 2
                && e.name.ends_with(".weight")
                && !e.name.contains("embed")
                && !e.name.contains("lm_head");
            assert_eq!(
                group.is_some(),
                linear,
                "{checkpoint}: {} {:?}",
                e.name,
                group
            );
            seen.extend(group);
        }
        assert_eq!(seen.len(), Group::ALL.len(), "{checkpoint}: {seen:?}");
    }
    let expert = format!("{EXPERT}.layers.0.input_layernorm.dense.weight");
    assert_eq!(Group::of(&expert), Some(Group::Expert));
    assert_eq!(
        Group::of(&format!("{LM}.layers.0.input_layernorm.weight")),
        None
    );
}

#[test]
fn when_only_one_group_is_quantized_expect_only_its_weights_rewritten() {
    let tmp = TempDir::new("quant-one-group");
    let out = tmp.join("expert");
    let src = fixtures().join("pi0_float32");
    quantize(&options(&src, &out, Scheme::W8, &[Group::Expert])).unwrap();
    let ck = Checkpoint::load(&out).unwrap();
    for e in ck.entries() {
        let int = e.dtype == safetensors::Dtype::I8;
        let expert = Group::of(&e.name) == Some(Group::Expert);
        assert_eq!(int, expert, "{}", e.name);
    }
}

/// The error `quantize` gives, and that nothing was left at `out`.
fn refused(opts: &QuantizeOptions) -> String {
    let e = quantize(opts).unwrap_err();
    assert!(!opts.out.exists(), "{} was written", opts.out.display());
    format!("{:#}", anyhow::Error::from(e))
}

#[test]
fn when_input_is_not_a_float_checkpoint_directory_or_block_is_bad_expect_refusal_naming_it() {
    let tmp = TempDir::new("quant-refusals");
    let src = fixtures().join("pi0_float32");
    let out = tmp.join("out");
    let e = refused(&options(
        &src.join("model.safetensors"),
        &out,
        Scheme::W8,
        &Group::ALL,
    ));
    assert!(e.contains("expected a checkpoint directory"), "{e}");
    let mut o = options(&src, &out, Scheme::W4, &Group::ALL);
    o.block = 48;
    let e = refused(&o);
    assert!(e.contains("--block 48: expected a power of two"), "{e}");
    // Quantizing a quantized checkpoint again is refused.
    let w8 = tmp.join("w8");
    quantize(&options(&src, &w8, Scheme::W8, &Group::ALL)).unwrap();
    let e = refused(&options(&w8, &out, Scheme::W4, &Group::ALL));
    assert!(e.contains("already quantized"), "{e}");
    std::fs::remove_file(w8.join(MANIFEST)).unwrap();
    let e = refused(&options(&w8, &out, Scheme::W4, &Group::ALL));
    assert!(
        e.contains("is stored as I8: this checkpoint is already quantized"),
        "{e}"
    );
    // A directory that is not a quantized checkpoint is never replaced.
    let notes = tmp.join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("keep.txt"), "x").unwrap();
    let e = quantize(&options(&src, &notes, Scheme::W8, &Group::ALL))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is not a pi0d quantized checkpoint (no quantization.json)"),
        "{e}"
    );
    assert!(notes.join("keep.txt").exists());
}

type Tensors = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// A copy of checkpoint directory `src` at `dst`, its weights passed through `edit`.
fn edited(src: &Path, dst: &Path, edit: impl FnOnce(&mut Tensors)) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = st
        .iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                v.dtype(),
                v.shape().to_vec(),
                v.data().to_vec(),
            )
        })
        .collect();
    edit(&mut tensors);
    let views = tensors.iter().map(|(n, d, s, b)| {
        let view = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
        (n.clone(), view)
    });
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

/// The tensor whose stored name ends with `name`.
fn tensor<'a>(
    t: &'a mut Tensors,
    name: &str,
) -> &'a mut (String, safetensors::Dtype, Vec<usize>, Vec<u8>) {
    t.iter_mut().find(|(n, ..)| n.ends_with(name)).unwrap()
}

const UP: &str = "gemma_expert.model.layers.1.mlp.up_proj.weight";

#[test]
fn when_a_weight_is_not_finite_expect_refusal_naming_the_tensor_and_nothing_written() {
    let tmp = TempDir::new("quant-nan");
    let src = tmp.join("src");
    edited(&fixtures().join("pi0_float32"), &src, |t| {
        tensor(t, UP).3[4 * 70..4 * 71].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let e = refused(&options(&src, &tmp.join("out"), Scheme::W8, &Group::ALL));
    assert!(e.contains(UP), "{e}");
}

/// The error loading `dir` as a model gives.
fn load_error(dir: &Path) -> String {
    let ck = Checkpoint::load(dir).unwrap();
    let e = Pi0Model::load(&ck, None, 1).err().unwrap();
    format!("{:#}", anyhow::Error::from(e))
}

#[test]
fn when_quantized_weights_or_their_scales_are_malformed_expect_load_error_naming_them() {
    let tmp = TempDir::new("quant-malformed");
    let w4 = tmp.join("w4");
    quantize(&options(
        &fixtures().join("pi0_float32"),
        &w4,
        Scheme::W4,
        &Group::ALL,
    ))
    .unwrap();
    let scale = format!("{UP}_scale");
    let case = |name: &str, edit: &dyn Fn(&mut Tensors)| {
        let dir = tmp.join(name);
        edited(&w4, &dir, edit);
        load_error(&dir)
    };
    let e = case("no-scale", &|t| t.retain(|(n, ..)| !n.ends_with(&scale)));
    assert!(e.contains(&format!("quantized tensor `paligemma_with_expert.{UP}`: stored as U8 (quantized) without its scales")), "{e}");
    let e = case("nan-scale", &|t| {
        tensor(t, &scale).3[..4].copy_from_slice(&f32::INFINITY.to_le_bytes())
    });
    assert!(
        e.contains(&scale) && e.contains("non-finite value at index 0"),
        "{e}"
    );
    // [64, 32] inputs in blocks of 32 is one block per row; two per row would be blocks of 16,
    // three cannot divide 32.
    let e = case("odd-blocks", &|t| {
        let s = tensor(t, &scale);
        s.2 = vec![64 / 2, 3];
        s.3 = vec![0; 64 / 2 * 3 * 4];
    });
    assert!(
        e.contains("have shape [32, 3], expected [64, 32 / block]"),
        "{e}"
    );
    let e = case("f16-scale", &|t| {
        let s = tensor(t, &scale);
        s.1 = safetensors::Dtype::F16;
        s.3.truncate(s.3.len() / 2);
    });
    assert!(
        e.contains(&scale) && e.contains("has dtype F16, expected F32 (scales)"),
        "{e}"
    );
    let e = case("i16-weight", &|t| {
        let w = tensor(t, UP);
        w.1 = safetensors::Dtype::I16;
        w.3 = vec![0; w.3.len() * 2];
    });
    assert!(
        e.contains(UP) && e.contains("has dtype I16, expected F32, BF16 or F16, or I8 / U8"),
        "{e}"
    );
    // A manifest that is not ours, or whose scheme does not store the integers the weights
    // hold (it decides how int8 weights multiply), is refused on opening, naming both.
    let manifest = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let dir = tmp.join(name);
        edited(&w4, &dir, |_| {});
        let path = dir.join(MANIFEST);
        let mut m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut m);
        std::fs::write(&path, m.to_string()).unwrap();
        let e = Checkpoint::load(&dir).err().expect("refused");
        format!("{:#}", anyhow::Error::from(e))
    };
    let e = manifest("other-format", &|m| m["format"] = "someone-else".into());
    assert!(
        e.contains(MANIFEST) && e.contains("format `someone-else`, expected `pi0d-quantized`"),
        "{e}"
    );
    for scheme in ["w8", "w8a8", "bf16"] {
        let e = manifest(&format!("says-{scheme}"), &|m| m["scheme"] = scheme.into());
        assert!(
            e.contains(MANIFEST)
                && e.contains("packed int4 (U8) values, which scheme")
                && e.contains(&format!("`{scheme}` does not store")),
            "{e}"
        );
    }
}

#[test]
fn when_an_int8_checkpoints_manifest_says_bf16_expect_it_refused_naming_a_tensor() {
    let tmp = TempDir::new("quant-manifest-w8");
    let w8 = tmp.join("w8");
    quantize(&options(
        &fixtures().join("pi0_float32"),
        &w8,
        Scheme::W8,
        &[Group::Expert],
    ))
    .unwrap();
    let path = w8.join(MANIFEST);
    let text = std::fs::read_to_string(&path).unwrap();
    // As written, it opens; as w8a8 too (the same integers, multiplied by int8 activations).
    Checkpoint::load(&w8).unwrap();
    std::fs::write(
        &path,
        text.replace("\"scheme\": \"w8\"", "\"scheme\": \"w8a8\""),
    )
    .unwrap();
    assert!(Checkpoint::load(&w8).unwrap().int8_activations);
    std::fs::write(
        &path,
        text.replace("\"scheme\": \"w8\"", "\"scheme\": \"bf16\""),
    )
    .unwrap();
    let e = format!(
        "{:#}",
        anyhow::Error::from(Checkpoint::load(&w8).err().unwrap())
    );
    assert!(
        e.contains("gemma_expert.model.layers.")
            && e.contains("holds int8 values, which scheme `bf16` does not store"),
        "{e}"
    );
}

#[test]
fn when_a_manifest_lists_a_rotated_weight_that_cannot_be_expect_it_refused_naming_it() {
    let tmp = TempDir::new("quant-manifest-rotated");
    let dir = tmp.join("w8a8");
    quantize(&options(
        &fixtures().join("pi0_float32"),
        &dir,
        Scheme::W8a8,
        &[Group::Expert],
    ))
    .unwrap();
    let path = dir.join(MANIFEST);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // The fixture's MLPs are narrower than any rotated one.
    assert!(written.get("rotated").is_none(), "{written}");
    let layer = |part: &str, n: usize| format!("model.paligemma_with_expert.{part}.layers.{n}");
    let down = format!("{}.mlp.down_proj.weight", layer("gemma_expert.model", 0));
    let with = |scheme: &str, rotated: &str| {
        let mut m = written.clone();
        m["scheme"] = scheme.into();
        m["rotated"] = serde_json::json!([rotated]);
        std::fs::write(&path, m.to_string()).unwrap();
        Checkpoint::load(&dir).map(|ck| ck.rotated.clone())
    };
    let taken = with("w8a8", &down).unwrap();
    assert!(
        taken.contains(down.strip_prefix("model.").unwrap()),
        "{taken:?}"
    );
    for (scheme, rotated, expected) in [
        ("w8", down.clone(), "scheme `w8` rotates nothing"),
        (
            "w8a8",
            format!("{}.input_layernorm.weight", layer("gemma_expert.model", 0)),
            "not an int8 linear weight",
        ),
        (
            "w8a8",
            format!(
                "{}.mlp.down_proj.weight",
                layer("paligemma.model.language_model", 0)
            ),
            "not an int8 linear weight",
        ),
        (
            "w8a8",
            format!("{}.mlp.down_proj.weight", layer("gemma_expert.model", 99)),
            "not an int8 linear weight",
        ),
    ] {
        let e = format!(
            "{:#}",
            anyhow::Error::from(with(scheme, &rotated).unwrap_err())
        );
        assert!(
            e.contains(MANIFEST) && e.contains(&rotated) && e.contains(expected),
            "{e}"
        );
    }
}

/// The targets a calibrated scheme meets against lerobot's actions, on every fixture: (cosine
/// at least, max abs error at most).
fn targets(scheme: Scheme) -> (f64, f32) {
    match scheme {
        Scheme::W4 => (0.998, f32::INFINITY),
        _ => (0.9999, 2e-2),
    }
}

/// The bounds a scheme rounded to nearest (no calibration) is held to against lerobot's
/// actions: (cosine at least, max abs error at most). `w8` and `bf16` hold the targets
/// everywhere but on the random-weight pi0 fixture, which amplifies any rounding more than the
/// others (its `w8` reaches 2.3e-2 to 2.8e-2 with the cosine target met). `w4` falls short of
/// its target cosine 0.998 on pi0 (0.9976 random, 0.988 trained): docs/models.md names it as
/// losing accuracy; the bound here keeps it from getting worse. Calibrated, every scheme meets
/// `targets`.
fn bounds(model: &str, scheme: Scheme) -> (f64, f32) {
    match scheme {
        Scheme::W8 | Scheme::W8a8 | Scheme::Bf16 if model == "pi0_float32" => (0.9999, 3e-2),
        Scheme::W8 | Scheme::W8a8 | Scheme::Bf16 => (0.9999, 2e-2),
        Scheme::W4 => (0.985, f32::INFINITY),
    }
}

#[test]
fn when_each_group_is_quantized_alone_expect_every_scheme_within_its_bounds() {
    // The sensitivity table: each group alone, then the default set, per scheme and model.
    let tmp = TempDir::new("quant-groups");
    let mut table = vec![format!(
        "{:<13} {:<10} {:<6} {:>10} {:>10}",
        "model", "groups", "scheme", "cosine", "max err"
    )];
    let mut outside = Vec::new();
    for (checkpoint, case) in CASES {
        let sets = Group::ALL
            .iter()
            .map(|g| (g.name(), vec![*g]))
            .chain([("default", Group::DEFAULT.to_vec())]);
        for (label, groups) in sets {
            for scheme in [Scheme::W8, Scheme::W8a8, Scheme::W4, Scheme::Bf16] {
                let out = tmp.join(format!("{checkpoint}-{label}-{scheme}"));
                quantize(&options(
                    &fixtures().join(checkpoint),
                    &out,
                    scheme,
                    &groups,
                ))
                .unwrap();
                let (cos, max) = against_lerobot(&out, case);
                table.push(format!(
                    "{checkpoint:<13} {label:<10} {scheme:<6} {cos:>10.6} {max:>10.1e}"
                ));
                let (min_cos, max_err) = bounds(checkpoint, scheme);
                if cos < min_cos || max > max_err {
                    outside.push(format!("{checkpoint} {label} {scheme}"));
                }
                std::fs::remove_dir_all(&out).unwrap();
            }
        }
    }
    // The trained checkpoint, whole pipeline, actions in the robot's units.
    for scheme in [Scheme::W8, Scheme::W8a8, Scheme::W4, Scheme::Bf16] {
        let out = tmp.join(format!("hil-{scheme}"));
        quantize(&options(
            &fixtures().join(HIL),
            &out,
            scheme,
            &Group::DEFAULT,
        ))
        .unwrap();
        let (cos, max) = hil_against_lerobot(&out);
        table.push(format!(
            "{:<13} {:<10} {scheme:<6} {cos:>10.6} {max:>10.1e}",
            "hil (trained)", "default"
        ));
        let (min_cos, max_err) = bounds("hil", scheme);
        if cos < min_cos || max > max_err {
            outside.push(format!("hil {scheme}"));
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(outside.is_empty(), "outside their bounds: {outside:?}");
}

/// Calibration inputs for each fixture checkpoint: cases other than the one measured (other
/// camera counts, prompts, states and noise), so the scales are not fitted to the test's input.
const CALIBRATION: [(&str, &[&str]); 2] = [
    (
        "pi0_float32",
        &["pi0_f32_1cam_short", "pi0_f32_3cam_masked"],
    ),
    ("pi05_float32", &["pi05_f32_1cam", "pi05_f32_rtc_linear"]),
];

/// Every calibrated weight's `s` is in exactly one place: folded into the norm before it (one
/// folded norm weight holds the `s` of the weights its output feeds) or kept beside it as
/// `NAME.weight_input_scale`; folded norms are stored as f32. Returns how many were folded.
fn assert_scales_placed_once(dir: &Path, m: &Manifest) -> usize {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept = st
        .names()
        .iter()
        .filter(|n| n.ends_with(".weight_input_scale"))
        .count();
    let mut folded = 0;
    for name in &m.folded_norms {
        assert_eq!(
            st.tensor(name).unwrap().dtype(),
            safetensors::Dtype::F32,
            "{name}"
        );
        folded += [
            (".input_layernorm.weight", 3),
            (".layer_norm1.weight", 3),
            (".post_attention_layernorm.weight", 2),
            (".layer_norm2.weight", 1),
        ]
        .iter()
        .find(|(end, _)| name.ends_with(end))
        .map_or(0, |(_, feeds)| *feeds);
    }
    assert_eq!(kept + folded, m.smoothed, "{m:?}");
    folded
}

#[test]
fn when_random_weights_are_calibrated_on_other_inputs_expect_every_scheme_at_its_target() {
    let tmp = TempDir::new("quant-calibrated");
    let mut table = vec![format!(
        "{:<13} {:<6} {:>12} {:>10} {:>12} {:>10}",
        "model", "scheme", "cos plain", "max plain", "cos calib", "max calib"
    )];
    let mut failed = Vec::new();
    for ((checkpoint, case), (_, calibration)) in CASES.iter().zip(CALIBRATION) {
        let files: Vec<PathBuf> = calibration
            .iter()
            .map(|c| fixtures().join("cases").join(c).join("inputs.safetensors"))
            .collect();
        for scheme in [Scheme::W8, Scheme::W8a8, Scheme::W4] {
            let src = fixtures().join(checkpoint);
            let plain = tmp.join(format!("{checkpoint}-{scheme}"));
            quantize(&options(&src, &plain, scheme, &Group::DEFAULT)).unwrap();
            let calibrated = tmp.join(format!("{checkpoint}-{scheme}-calibrated"));
            let mut opts = options(&src, &calibrated, scheme, &Group::DEFAULT);
            opts.calibration = files.clone();
            let m = quantize(&opts).unwrap().manifest;
            assert_eq!(m.calibration, files);
            // Each of these cases holds one observation.
            assert_eq!(m.observations, files.len());
            assert_eq!(m.rounding, Rounding::Gptq);
            assert_scales_placed_once(&calibrated, &m);
            let (pc, pm) = against_lerobot(&plain, case);
            let (cc, cm) = against_lerobot(&calibrated, case);
            table.push(format!(
                "{checkpoint:<13} {scheme:<6} {pc:>12.6} {pm:>10.1e} {cc:>12.6} {cm:>10.1e}   ({} of {} inputs scaled)",
                m.scaled_inputs(),
                m.smoothing.len()
            ));
            let (min_cos, max_err) = targets(scheme);
            let _ = pm;
            if cc < min_cos || cm > max_err {
                failed.push(format!("{checkpoint} {scheme}"));
            }
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(
        failed.is_empty(),
        "calibrated outside the bounds: {failed:?}"
    );
}

/// What the trained HIL checkpoint's layers see on its scene's frame mirrored and shifted (the
/// cube elsewhere), with other states and noise than the measured run's.
fn hil_calibration() -> calibrate::Calibration {
    use crate::config::BackendOptions;
    use crate::observation::CameraFrame;
    use crate::policy::pi0::pipeline::{Pi0Pipeline, PipelineOptions};
    use crate::policy::pi0::quant::calibrate::Recorder;
    use std::sync::Arc;
    let src = fixtures().join(HIL);
    let recorder = Arc::new(Recorder::new(calibrate::Purpose::Quantizing(Scheme::W8)));
    let mut p = Pi0Pipeline::load_observed(
        &PipelineOptions {
            checkpoint: src.clone(),
            arch: None,
            tokenizer: None,
            threads: 2,
            backend: BackendOptions::Cpu,
            openpi_delta_actions: None,
        },
        Some(recorder.clone()),
    )
    .unwrap();
    let dir = fixtures().join("cases/hil_above_cube_end_to_end");
    let raw = TensorFile::read(&dir.join("raw.safetensors")).unwrap();
    let (shape, data) = u8s(&raw, "frame0");
    let (h, w) = (shape[0], shape[1]);
    let pixel = |x: usize, y: usize| &data[(y * w + x) * 3..(y * w + x) * 3 + 3];
    let mirrored: Vec<u8> = (0..h * w)
        .flat_map(|i| pixel(w - 1 - i % w, i / w).to_vec())
        .collect();
    let shifted = |by: usize, image: &[u8]| -> Vec<u8> {
        (0..h * w)
            .flat_map(|i| {
                let at = (i / w * w + (i % w + by) % w) * 3;
                image[at..at + 3].to_vec()
            })
            .collect()
    };
    let frames = [
        shifted(w / 5, &data),
        shifted(2 * w / 5, &data),
        shifted(w / 3, &mirrored),
        mirrored,
    ];
    let (_, state) = raw.f32("state", &[Some(7)]).unwrap();
    let task = "move the gripper above the red cube";
    for (i, image) in frames.into_iter().enumerate() {
        let frame: CameraFrame = rgb_frame(&shape, image);
        let state: Vec<f32> = state.iter().map(|v| v + 0.05 * (i as f32 - 1.5)).collect();
        let noise: Vec<f32> = (0..50 * 32)
            .map(|j| (((j * 7919 + i * 104_729) % 1000) as f32 / 500.0 - 1.0) * 1.7)
            .collect();
        recorder.begin_observation();
        p.run(&[Some(&frame)], &state, task, &noise).unwrap();
    }
    drop(p);
    recorder.finish()
}

/// The trained checkpoint calibrated through the whole pipeline on its scene's frame mirrored
/// and shifted (the cube elsewhere), with other states and noise than the measured run's.
#[test]
fn when_the_trained_checkpoint_is_calibrated_expect_every_scheme_at_its_target() {
    let tmp = TempDir::new("quant-hil-calibrated");
    let src = fixtures().join(HIL);
    let calibration = hil_calibration();
    let mut table = vec![format!(
        "{:<6} {:>10} {:>9} {:>10} {:>9}",
        "scheme", "cos plain", "max plain", "cos calib", "max calib"
    )];
    let mut failed = Vec::new();
    for scheme in [Scheme::W8, Scheme::W8a8, Scheme::W4] {
        let plain = tmp.join(format!("{scheme}"));
        quantize(&options(&src, &plain, scheme, &Group::DEFAULT)).unwrap();
        let mut opts = options(
            &src,
            &tmp.join(format!("{scheme}-calibrated")),
            scheme,
            &Group::DEFAULT,
        );
        opts.calibration = vec!["the scene, mirrored and shifted".into()];
        let m = write::quantize_with(&opts, Some(calibration.clone()))
            .unwrap()
            .manifest;
        assert!(m.smoothed > 0, "{m:?}");
        // The trained model's q/k/v and gate/up take their `s` in the norm before them.
        assert!(assert_scales_placed_once(&opts.out, &m) > 0, "{m:?}");
        let (pc, pm) = hil_against_lerobot(&plain);
        let (cc, cm) = hil_against_lerobot(&opts.out);
        table.push(format!(
            "{scheme:<6} {pc:>10.6} {pm:>9.1e} {cc:>10.6} {cm:>9.1e}   ({} of {} inputs scaled, {} norms folded)",
            m.scaled_inputs(),
            m.smoothing.len(),
            m.folded_norms.len()
        ));
        // Calibrated, every scheme meets the targets: w4 included (0.988 and 0.21 without).
        let (min_cos, max_err) = targets(scheme);
        if cc < min_cos || cm > max_err {
            failed.push(scheme);
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(
        failed.is_empty(),
        "calibrated outside the targets: {failed:?}"
    );
}

#[test]
fn when_the_shapes_come_from_an_arch_file_elsewhere_expect_calibration_to_use_them() {
    // `pi0d export --arch FILE --calibration ...` on a checkpoint without its own arch.json:
    // the float model that calibration runs must have the overridden shapes too.
    let tmp = TempDir::new("quant-arch");
    let src = fixtures().join("pi0_float32");
    let bare = tmp.join("bare");
    edited(&src, &bare, |_| {});
    std::fs::remove_file(bare.join("arch.json")).unwrap();
    let inputs = [fixtures().join("cases/pi0_f32_1cam_short/inputs.safetensors")];
    let Err(without) = calibrate::collect_any(&bare, None, &inputs, calibrate::Purpose::Ranges, 2)
    else {
        panic!("calibrated a checkpoint without its shapes");
    };
    assert!(without.to_string().contains("--arch"), "{without}");
    let arch = src.join("arch.json");
    let with =
        calibrate::collect_any(&bare, Some(&arch), &inputs, calibrate::Purpose::Ranges, 2).unwrap();
    let same = calibrate::collect_any(&src, None, &inputs, calibrate::Purpose::Ranges, 2).unwrap();
    assert!(!with.ranges().is_empty());
    assert_eq!(with.ranges(), same.ranges());
    // For ranges only, no GPTQ sums are kept; for quantizing, every linear layer's.
    let up = format!("paligemma_with_expert.{UP}");
    assert!(with.gram(&up).is_none());
    let quantizing = calibrate::collect_any(
        &src,
        None,
        &inputs,
        calibrate::Purpose::Quantizing(Scheme::W8),
        2,
    )
    .unwrap();
    assert!(quantizing.gram(&up).is_some());
}
