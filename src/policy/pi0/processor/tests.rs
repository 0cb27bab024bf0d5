//! The processor's steps read and checked against lerobot's saved pipelines edited the way a
//! newer lerobot, a hand edit or a broken export would: each refusal names the file, the step
//! (index and name) and the setting; what lerobot does that pi0d can do is done.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use super::golden_tests::{case, load};
use crate::config::BackendOptions;
use crate::policy::pi0::pipeline::{Pi0Pipeline, PipelineOptions};

fn edit(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// The steps of a pipeline file, mutable.
fn steps(v: &mut Value) -> &mut Vec<Value> {
    v["steps"].as_array_mut().unwrap()
}

fn step<'a>(v: &'a mut Value, name: &str) -> &'a mut Value {
    steps(v)
        .iter_mut()
        .find(|s| s["registry_name"] == name)
        .unwrap()
}

fn options(dir: &Path, delta: Option<Vec<bool>>) -> PipelineOptions {
    PipelineOptions {
        checkpoint: dir.to_path_buf(),
        arch: None,
        tokenizer: None,
        threads: 1,
        backend: BackendOptions::Cpu,
        openpi_delta_actions: delta,
    }
}

fn refused(dir: &Path) -> String {
    refused_with(dir, None)
}

fn refused_with(dir: &Path, delta: Option<Vec<bool>>) -> String {
    match Pi0Pipeline::load(&options(dir, delta)) {
        Ok(_) => panic!("{} was loaded", dir.display()),
        Err(e) => crate::errors::Chain(&e).to_string(),
    }
}

/// A normalizer's state file, changed by `f`.
fn rewrite_stats(path: &Path, f: impl FnOnce(&mut HashMap<String, Vec<f32>>)) {
    let mut stats = crate::policy::pi0::normalize::read_stats(path).unwrap();
    f(&mut stats);
    let tensors: Vec<(&str, Vec<usize>, &[f32])> = stats
        .iter()
        .map(|(k, v)| (k.as_str(), vec![v.len()], v.as_slice()))
        .collect();
    crate::policy::pi0::tensorfile::write_f32(path, &tensors).unwrap();
}

const PRE: &str = "policy_preprocessor.json";
const POST: &str = "policy_postprocessor.json";

#[test]
fn when_a_step_is_unknown_expect_the_checkpoint_refused_naming_file_index_and_step() {
    let c = case("pi0_relative_gripper_excluded");
    edit(&c.checkpoint.join(PRE), |v| {
        steps(v).insert(
            3,
            json!({"registry_name": "image_crop_resize_processor", "config": {}}),
        )
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains(PRE)
            && e.contains("step 3 (`image_crop_resize_processor`)")
            && e.contains("not a preprocessor step pi0d knows"),
        "{e}"
    );
    // An unregistered step, by class path.
    let c = case("pi0_relative_gripper_excluded");
    edit(&c.checkpoint.join(POST), |v| {
        steps(v).push(json!({"class": "my_robot.processors.ClipActions", "config": {}}))
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains(POST) && e.contains("step 3") && e.contains("my_robot.processors.ClipActions"),
        "{e}"
    );
}

#[test]
fn when_a_known_step_has_an_unknown_or_unsupported_setting_expect_it_named() {
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        (
            PRE,
            "tokenizer_processor",
            json!({"pad_to_multiple_of": 8}),
            "setting `pad_to_multiple_of`",
        ),
        (
            PRE,
            "tokenizer_processor",
            json!({"task_key": "instruction"}),
            "setting `task_key`",
        ),
        (
            PRE,
            "tokenizer_processor",
            json!({"padding_side": "middle"}),
            "setting `padding_side`",
        ),
        (
            PRE,
            "tokenizer_processor",
            json!({"truncation": "only_second"}),
            "setting `truncation`",
        ),
        (
            PRE,
            "device_processor",
            json!({"float_dtype": "bfloat16"}),
            "setting `float_dtype`: `bfloat16`",
        ),
        (
            PRE,
            "normalizer_processor",
            json!({"stats": {}}),
            "setting `stats`",
        ),
        (
            PRE,
            "normalizer_processor",
            json!({"norm_map": {"STATE": "LOG"}}),
            "setting `norm_map.STATE`",
        ),
        (
            PRE,
            "relative_actions_processor",
            json!({"exclude_joints": ["gripper", 3]}),
            "setting `exclude_joints[1]`",
        ),
        (
            POST,
            "absolute_actions_processor",
            json!({"enabled": "yes"}),
            "setting `enabled`",
        ),
        (
            POST,
            "unnormalizer_processor",
            json!({"clip": true}),
            "setting `clip`",
        ),
    ];
    for (file, name, settings, want) in cases {
        let c = case("pi0_relative_gripper_excluded");
        edit(&c.checkpoint.join(file), |v| {
            let s = step(v, name);
            for (k, x) in settings.as_object().unwrap() {
                s["config"][k] = x.clone();
            }
        });
        let e = refused(&c.checkpoint);
        assert!(
            e.contains(file) && e.contains(&format!("(`{name}`)")) && e.contains(want),
            "{name} {settings}: {e}"
        );
    }
}

#[test]
fn when_relative_and_absolute_steps_disagree_expect_refused() {
    // The model predicts offsets, but nothing adds the state back.
    let c = case("pi0_relative_gripper_excluded");
    edit(&c.checkpoint.join(POST), |v| {
        step(v, "absolute_actions_processor")["config"]["enabled"] = json!(false)
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains("every action would be an offset commanded as a position"),
        "{e}"
    );
    // The state is added back, but the model was trained on absolute actions.
    let c = case("pi0_relative_gripper_excluded");
    edit(&c.checkpoint.join(PRE), |v| {
        step(v, "relative_actions_processor")["config"]["enabled"] = json!(false)
    });
    let e = refused(&c.checkpoint);
    assert!(e.contains("trained on absolute actions"), "{e}");
    // No relative step at all to keep the state.
    let c = case("pi0_relative_gripper_excluded");
    edit(&c.checkpoint.join(PRE), |v| {
        steps(v).retain(|s| s["registry_name"] != "relative_actions_processor")
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains("(`absolute_actions_processor`)") && e.contains("no relative_actions_processor"),
        "{e}"
    );
    // config.json and the steps disagree.
    let c = case("pi0_rename_map");
    edit(&c.checkpoint.join("config.json"), |v| {
        v["use_relative_actions"] = json!(true)
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains("use_relative_actions = true") && e.contains("keep actions absolute"),
        "{e}"
    );
}

#[test]
fn when_one_pipeline_file_is_missing_or_has_no_tokenizer_expect_refused() {
    let c = case("pi0_rename_map");
    std::fs::remove_file(c.checkpoint.join(POST)).unwrap();
    let e = refused(&c.checkpoint);
    assert!(
        e.contains(PRE) && e.contains("policy_postprocessor.json is missing"),
        "{e}"
    );
    let c = case("pi0_rename_map");
    edit(&c.checkpoint.join(PRE), |v| {
        steps(v).retain(|s| s["registry_name"] != "tokenizer_processor")
    });
    let e = refused(&c.checkpoint);
    assert!(e.contains("no tokenizer_processor step"), "{e}");
}

#[test]
fn when_images_would_be_normalized_or_the_state_renamed_away_expect_refused() {
    let c = case("pi0_rename_map");
    let stats_file = c
        .checkpoint
        .join("policy_preprocessor_step_6_normalizer_processor.safetensors");
    // Stats for a camera and a VISUAL mode that uses them.
    rewrite_stats(&stats_file, |stats| {
        stats.insert("observation.images.cam0.mean".into(), vec![0.5; 3]);
        stats.insert("observation.images.cam0.std".into(), vec![0.2; 3]);
    });
    edit(&c.checkpoint.join(PRE), |v| {
        step(v, "normalizer_processor")["config"]["norm_map"]["VISUAL"] = json!("MEAN_STD")
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains("normalizes `observation.images.cam0` (MEAN_STD)"),
        "{e}"
    );

    let c = case("pi0_rename_map");
    edit(&c.checkpoint.join(PRE), |v| {
        step(v, "rename_observations_processor")["config"]["rename_map"]["observation.state"] =
            json!("observation.joints")
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains("renames observation.state to `observation.joints`"),
        "{e}"
    );
}

#[test]
fn when_stats_are_missing_or_unselected_expect_lerobots_pass_through_and_a_half_pair_refused() {
    // normalize_observation_keys without the state: lerobot leaves it as it is.
    let c = case("pi0_rename_map");
    edit(&c.checkpoint.join(PRE), |v| {
        step(v, "normalizer_processor")["config"]["normalize_observation_keys"] =
            json!(["observation.images.cam0"])
    });
    let p = load(&c.checkpoint);
    let state = [0.25f32, -0.5, 0.1, 0.2, 0.3, 0.4, 0.05];
    assert_eq!(p.preprocess(&state, "x").unwrap().state, state);
    assert!(p
        .processor
        .describe(&[])
        .iter()
        .any(|l| l.contains("the state reaches the model unnormalized")));

    // A mode whose second stat is absent: lerobot fails at the first observation.
    let c = case("pi0_rename_map");
    edit(&c.checkpoint.join(PRE), |v| {
        step(v, "normalizer_processor")["config"]["norm_map"]["STATE"] = json!("QUANTILE10")
    });
    let stats_file = c
        .checkpoint
        .join("policy_preprocessor_step_6_normalizer_processor.safetensors");
    rewrite_stats(&stats_file, |stats| {
        stats.remove("observation.state.q90");
    });
    let e = refused(&c.checkpoint);
    assert!(
        e.contains(
            "QUANTILE10 normalization of `observation.state` needs stat `observation.state.q90`"
        ),
        "{e}"
    );
}

#[test]
fn when_check_describes_a_relative_checkpoint_expect_the_joints_named() {
    let c = case("pi0_relative_gripper_excluded");
    let p = load(&c.checkpoint);
    let lines = p.processor.describe(&[]);
    assert!(
        lines[0].contains("actions relative to the observed joint state for 6 of 7 (joint0.pos, joint1.pos, joint2.pos, joint3.pos, joint4.pos, joint5.pos), gripper.pos absolute"),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("5 relative_actions_processor (enabled)")),
        "{lines:#?}"
    );
    let c = case("pi0_relative_no_names");
    let lines = load(&c.checkpoint).processor.describe(&[]);
    assert!(
        lines[0].contains("7 of 7") && lines[0].contains("match none, as in lerobot"),
        "{lines:#?}"
    );
    let c = case("pi0_tokens_longest");
    let lines = load(&c.checkpoint).processor.describe(&[]);
    assert!(lines[0].contains("actions absolute"), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cut to 48 tokens, not padded")),
        "{lines:#?}"
    );
}

/// The pi0 fixture as openpi ships a checkpoint: the weights and `norm_stats.json`, no
/// lerobot pipeline.
fn openpi_checkpoint() -> crate::test_dirs::TempDir {
    let c = case("pi0_rename_map");
    let dir = crate::test_dirs::TempDir::new("processor-openpi");
    for f in [
        "model.safetensors",
        "arch.json",
        "tokenizer.json",
        "config.json",
    ] {
        std::fs::copy(c.checkpoint.join(f), dir.join(f)).unwrap();
    }
    let stats = json!({"norm_stats": {
        "state": {"mean": [0.1, -0.2, 0.3, 0.0, 0.05, -0.1, 0.02], "std": [0.5, 0.4, 0.3, 0.6, 0.2, 0.7, 0.01]},
        "actions": {"mean": [0.01, 0.0, -0.02, 0.0, 0.01, 0.0, 0.02], "std": [0.05, 0.04, 0.03, 0.06, 0.02, 0.07, 0.01]}
    }});
    std::fs::write(dir.join("norm_stats.json"), stats.to_string()).unwrap();
    dir
}

#[test]
fn when_an_openpi_checkpoint_declares_delta_actions_expect_the_state_added_back_as_openpi_does() {
    let dir = openpi_checkpoint();
    let state = [0.4f32, -0.3, 0.9, 0.1, -0.6, 0.2, 0.03];
    let noise: Vec<f32> = (0..50 * 32)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let run = |delta: Option<Vec<bool>>| {
        let mut p = Pi0Pipeline::load(&options(&dir, delta)).unwrap();
        let lines = p.processor.describe(&[]);
        let (a, _) = p.run(&[], &state, "stack the blocks", &noise).unwrap();
        (a, lines)
    };
    let (absolute, lines) = run(None);
    assert!(
        lines[0].contains("openpi keeps delta actions in its training config")
            && lines[0].contains("policy.openpi_delta_actions = [6, -1]"),
        "{lines:#?}"
    );
    // openpi's make_bool_mask(6, -1): six joints relative, the gripper absolute.
    let (delta, lines) = run(Some(vec![true, true, true, true, true, true, false]));
    assert!(lines[0].contains("6 of 7"), "{lines:#?}");
    // openpi's AbsoluteActions adds the state its outputs carry: normalized (x - mean) /
    // (std + 1e-6) and unnormalized again, x (std + 1e-6) + mean, in float32.
    let mean = [0.1f32, -0.2, 0.3, 0.0, 0.05, -0.1, 0.02];
    let std = [0.5f32, 0.4, 0.3, 0.6, 0.2, 0.7, 0.01];
    for (a, d) in absolute.iter().zip(&delta) {
        for j in 0..7 {
            let kept = (state[j] - mean[j]) / (std[j] + 1e-6) * (std[j] + 1e-6) + mean[j];
            let want = if j < 6 { a[j] + kept } else { a[j] };
            assert_eq!(d[j], want, "joint {j}");
        }
    }
    // A mask wider than the state is refused; a lerobot checkpoint does not take one.
    let c = case("pi0_rename_map");
    let e = refused_with(&c.checkpoint, Some(vec![true; 3]));
    assert!(
        e.contains("policy.openpi_delta_actions is for openpi checkpoints"),
        "{e}"
    );
}
