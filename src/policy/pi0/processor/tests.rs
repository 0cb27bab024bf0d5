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

fn refused(dir: &Path) -> String {
    match Pi0Pipeline::load(&PipelineOptions {
        checkpoint: dir.to_path_buf(),
        arch: None,
        tokenizer: None,
        threads: 1,
        backend: BackendOptions::Cpu,
    }) {
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
