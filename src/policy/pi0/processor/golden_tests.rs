//! The processor steps against lerobot's own pipelines (tools/make_golden_processors.py): each
//! case is what lerobot 0.6.1 saved beside a checkpoint (config.json, both pipeline files and
//! their stats) with a raw observation and the actions lerobot's preprocessor -> model ->
//! postprocessor gave for it. The weights are the committed pi0 / pi0.5 fixtures, put beside
//! the case's files in a scratch checkpoint.

use std::path::{Path, PathBuf};

use crate::chunk::ChunkPrefix;
use crate::config::{BackendOptions, CameraSource, RtcSettings, Schedule};
use crate::observation::CameraFrame;
use crate::policy::cameras::{bind, ModelCameras};
use crate::policy::pi0::lerobot_tests::{rgb_frame, u8s};
use crate::policy::pi0::pipeline::{Pi0Pipeline, PipelineOptions};
use crate::policy::pi0::tensorfile::TensorFile;
use crate::test_dirs::TempDir;

pub(crate) struct Case {
    pub(crate) dir: PathBuf,
    pub(crate) json: serde_json::Value,
    /// A checkpoint: the case's files beside the base checkpoint's weights and tokenizer.
    pub(crate) checkpoint: TempDir,
}

/// Case `name`, assembled into a scratch checkpoint directory.
pub(crate) fn case(name: &str) -> Case {
    let (dir, checkpoint) = crate::test_dirs::processor_case(name);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    Case {
        dir,
        json,
        checkpoint,
    }
}

pub(crate) fn load(checkpoint: &Path) -> Pi0Pipeline {
    Pi0Pipeline::load(&PipelineOptions {
        checkpoint: checkpoint.to_path_buf(),
        arch: None,
        tokenizer: None,
        threads: 2,
        backend: BackendOptions::Cpu,
        openpi_delta_actions: None,
    })
    .unwrap_or_else(|e| panic!("{}: {}", checkpoint.display(), crate::errors::Chain(&e)))
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The case's observation through pi0d's pipeline, its cameras bound by the robot's names as
/// `[ros.cameras]` would bind them; the actions are compared with lerobot's.
fn run_case(name: &str) {
    let c = case(name);
    let mut p = load(&c.checkpoint);
    let raw = TensorFile::read(&c.dir.join("raw.safetensors")).unwrap();
    let task = c.json["task"].as_str().unwrap();
    let robot_cameras: Vec<String> = c.json["cameras"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let frames: Vec<CameraFrame> = (0..robot_cameras.len())
        .map(|i| {
            let (shape, data) = u8s(&raw, &format!("frame{i}"));
            rgb_frame(&shape, data)
        })
        .collect();
    let (_, state) = raw.f32("state", &[Some(7)]).unwrap();
    let (_, noise) = raw.f32("noise", &[Some(1), Some(50), Some(32)]).unwrap();

    // The cameras by the robot's names, through the checkpoint's rename_map.
    let sources: Vec<CameraSource> = robot_cameras
        .iter()
        .map(|n| CameraSource {
            model_name: Some(n.clone()),
            shown: format!("ros.cameras.{n}"),
        })
        .collect();
    let renames = p.camera_renames();
    let model = ModelCameras {
        names: &p.camera_names,
        count: p.cameras,
        source: "config.json",
        renames: &renames,
    };
    let slots = bind(&model, &sources, &["cam2".into()]).unwrap();
    p.set_camera_slots(slots);

    // The preprocessor alone: state and tokens as lerobot's.
    let pre = p.preprocess(state, task).unwrap();
    let (_, want_state) = raw.f32("normalized_state", &[Some(1), Some(7)]).unwrap();
    assert!(
        max_err(&pre.state, want_state) <= 1e-5,
        "{name}: normalized state {:?} vs {want_state:?}",
        pre.state
    );
    let (shape, want_tokens) = raw.i64("lang_tokens", &[Some(1), None]).unwrap();
    let want_masks = raw.mask("lang_masks", &[Some(1), None]).unwrap();
    let n = shape[1];
    assert_eq!(&pre.tokens[..n], want_tokens, "{name}: tokens");
    assert_eq!(&pre.token_masks[..n], want_masks, "{name}: token masks");
    assert!(
        pre.token_masks[n..].iter().all(|m| !m),
        "{name}: the model's extra tokens are masked"
    );

    let refs: Vec<Option<&CameraFrame>> = frames.iter().map(Some).collect();
    let guidance = c.json.get("rtc_inference_delay").map(|delay| {
        let (shape, leftover) = raw.f32("rtc_leftover", &[None, Some(7)]).unwrap();
        let settings = RtcSettings {
            schedule: Schedule::parse(c.json["rtc_schedule"].as_str().unwrap()).unwrap(),
            max_guidance_weight: c.json["rtc_max_guidance"].as_f64().unwrap() as f32,
        };
        // The re-anchored leftover is lerobot's, value for value.
        let mut model_leftover = leftover.to_vec();
        let reference = p.processor.reference(state);
        p.processor
            .leftover_to_model(&mut model_leftover, reference.as_deref());
        let (_, want) = raw
            .f32("rtc_model_leftover", &[Some(shape[0]), Some(7)])
            .unwrap();
        assert!(
            max_err(&model_leftover, want) <= 1e-5,
            "{name}: re-anchored leftover"
        );
        let prefix = ChunkPrefix {
            actions: leftover.iter().map(|x| f64::from(*x)).collect(),
            action_dim: 7,
            inference_delay: delay.as_u64().unwrap() as usize,
            execution_horizon: c.json["rtc_execution_horizon"].as_u64().unwrap() as usize,
        };
        p.conditioning(settings, &prefix, state).unwrap()
    });
    let (actions, _) = p
        .run_guided(&refs, state, task, noise, guidance.as_ref())
        .unwrap();
    let want = TensorFile::read(&c.dir.join("expected.safetensors")).unwrap();
    let (_, want) = want.f32("actions", &[Some(1), Some(50), Some(7)]).unwrap();
    let got: Vec<f32> = actions.into_iter().flatten().collect();
    let err = max_err(&got, want);
    assert!(err <= 2e-6, "{name}: max abs error {err}");
}

#[test]
fn when_pi0_predicts_relative_actions_with_the_gripper_excluded_expect_lerobots_absolute_actions() {
    run_case("pi0_relative_gripper_excluded");
}

#[test]
fn when_the_relative_step_names_no_actions_expect_every_joint_relative_as_lerobot() {
    run_case("pi0_relative_no_names");
}

#[test]
fn when_pi05_excludes_two_joints_by_case_insensitive_substring_expect_lerobots_actions() {
    run_case("pi05_relative_two_excluded");
}

#[test]
fn when_pi05_makes_every_joint_relative_expect_lerobots_actions() {
    run_case("pi05_relative_all");
}

#[test]
fn when_the_checkpoint_renames_the_robots_cameras_expect_them_fed_to_the_renamed_slots() {
    run_case("pi0_rename_map");
}

#[test]
fn when_the_tokenizer_pads_to_the_longest_expect_lerobots_tokens_and_actions() {
    run_case("pi0_tokens_longest");
}

#[test]
fn when_the_tokenizer_pads_on_the_left_expect_lerobots_tokens_and_actions() {
    run_case("pi05_tokens_left");
}

#[test]
fn when_rtc_guides_a_relative_pi0_expect_the_leftover_reanchored_and_lerobots_actions() {
    run_case("pi0_relative_rtc");
}

#[test]
fn when_rtc_guides_a_relative_pi05_expect_the_leftover_reanchored_and_lerobots_actions() {
    run_case("pi05_relative_rtc");
}
