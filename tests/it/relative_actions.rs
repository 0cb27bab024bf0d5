//! The daemon driving the simulated arm from a checkpoint whose model predicts actions relative
//! to the observed joint state (lerobot's `use_relative_actions`, openpi's delta actions): the
//! bundled random-weight model with lerobot's relative and absolute steps enabled and action
//! stats of offsets near zero, the gripper excluded (absolute at 0.02 m). Every chunk handed to
//! the control loop is lerobot's postprocessor applied to the model's own output (recorded
//! beside it) at the state of the observation it came from, and the arm stays where it is; read
//! as absolute positions, the same actions would drive every joint to about 0.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::json;

const JOINTS: [&str; 7] = [
    "shoulder_pan",
    "shoulder_lift",
    "elbow",
    "wrist_1",
    "wrist_2",
    "wrist_3",
    "gripper",
];
/// The action stats written into the checkpoint: offsets under a mrad (the random model drifts
/// by one per chunk at most), the gripper absolute.
const MEAN: [f32; 7] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.02];
const STD: [f32; 7] = [0.0002, 0.0002, 0.0002, 0.0002, 0.0002, 0.0002, 0.00002];

/// `action.mean` and `action.std` in a normalizer's state file replaced by `MEAN` and `STD`.
fn write_action_stats(path: &Path) {
    set_f32_tensors(path, |n| match n {
        "action.mean" => Some(MEAN.to_vec()),
        "action.std" => Some(STD.to_vec()),
        _ => None,
    });
}

/// models/tiny-pi0 as lerobot saves a checkpoint trained with `use_relative_actions=True`.
fn relative_checkpoint() -> TempDir {
    let dir = copied_checkpoint(&root().join("models/tiny-pi0"), "relative-checkpoint");
    let names: Vec<String> = JOINTS.iter().map(|j| format!("{j}.pos")).collect();
    edit_json(&dir.join("config.json"), |c| {
        c["use_relative_actions"] = json!(true);
        c["relative_exclude_joints"] = json!(["gripper"]);
        c["action_feature_names"] = json!(names);
    });
    edit_json(&dir.join("policy_preprocessor.json"), |p| {
        for s in p["steps"].as_array_mut().unwrap() {
            if s["registry_name"] == "relative_actions_processor" {
                s["config"] =
                    json!({"enabled": true, "exclude_joints": ["gripper"], "action_names": names});
            }
        }
    });
    edit_json(&dir.join("policy_postprocessor.json"), |p| {
        for s in p["steps"].as_array_mut().unwrap() {
            if s["registry_name"] == "absolute_actions_processor" {
                s["config"] = json!({"enabled": true});
            }
        }
    });
    write_action_stats(&dir.join("policy_preprocessor_step_6_normalizer_processor.safetensors"));
    write_action_stats(&dir.join("policy_postprocessor_step_0_unnormalizer_processor.safetensors"));
    dir
}

#[test]
fn when_the_daemon_runs_a_relative_action_checkpoint_expect_each_chunk_absolute_at_its_observed_state(
) {
    let ck = relative_checkpoint();
    let mut cfg = sim_model_config();
    cfg["policy"]["checkpoint"] = toml::Value::String(ck.display().to_string());
    let dir = scratch_dir("relative-run");
    let file = dir.join("run.mcap");
    cfg.insert(
        "record".into(),
        table(&[("path", toml::Value::String(file.display().to_string()))]),
    );

    // `check` says what the checkpoint does, in words.
    let check = common::procs::pi0d()
        .arg("check")
        .arg("--config")
        .arg(common::procs::write_config(&dir, &cfg))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        out.contains("processing: actions relative to the observed joint state for 6 of 7 (shoulder_pan.pos, shoulder_lift.pos, elbow.pos, wrist_1.pos, wrist_2.pos, wrist_3.pos), gripper.pos absolute"),
        "{out}"
    );

    let run = run_daemon("relative", &cfg, 4.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let r = mcap_read_back_with(&file, &["--values"]);
    let measured: Vec<Vec<f64>> = serde_json::from_value(r["measured"].clone()).unwrap();
    let chunks = r["chunks"].as_array().unwrap();
    // The arm's start pose (sim.toml's), which it keeps.
    let start = [0.0f32, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02];
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for c in chunks {
        let model = &c["model"];
        let out: Vec<Vec<f32>> = serde_json::from_value(model["actions"].clone()).unwrap();
        let state: Vec<f32> = serde_json::from_value(model["reference_state"].clone()).unwrap();
        // The state the actions are relative to is the arm's, in joint units (normalized it
        // would be near 0: the checkpoint's state stats are centred on the start pose).
        assert!(
            state.iter().zip(&start).all(|(a, b)| (a - b).abs() < 0.05),
            "seq {}: {state:?} is not the arm's state near {start:?}",
            c["seq"]
        );
        // lerobot's postprocessor: unnormalize (x std + mean), then + state for all but the
        // gripper, in float32.
        let positions: Vec<Vec<f64>> = serde_json::from_value(c["positions"].clone()).unwrap();
        for (row, got) in out.iter().zip(&positions) {
            for j in 0..7 {
                let mut want = row[j] * STD[j] + MEAN[j];
                if j < 6 {
                    want += state[j];
                }
                assert!(
                    (got[j] - f64::from(want)).abs() <= 1e-7,
                    "seq {} joint {}: {} vs {want}",
                    c["seq"],
                    JOINTS[j],
                    got[j]
                );
            }
        }
    }
    // The arm stays near its start, the gripper at 0.02 m.
    for m in &measured {
        for j in 0..7 {
            assert!(
                (m[j] - f64::from(start[j])).abs() < 0.05,
                "{} went to {} (start {})",
                JOINTS[j],
                m[j],
                start[j]
            );
        }
    }
}
