//! The model's inputs laid out from the configuration, through `pi0d check` and `run` (the
//! real binary, the bundled one-camera pi0 whose config.json names its camera `front` and has
//! a 7-entry state and action):
//! * cameras by name: a missing camera, an extra one and an unknown optional one are refused
//!   naming both sides; a declared optional camera passes; over ROS, a positional list must
//!   match the model's count;
//! * the state by entry (`policy.state`: joint names and constants, independent of the action
//!   order): its width checked against `input_features.observation.state`.

use crate::common;

use common::*;
use toml::Value;

/// The bundled pi0 model over ROS, with `ros.cameras` as given.
fn ros_model(cameras: Value) -> toml::Table {
    let mut cfg = sim_model_config();
    cfg["robot"]["io"] = Value::String("ros".into());
    cfg.remove("sim");
    let mut ros = toml::Table::new();
    ros.insert("cameras".into(), cameras);
    cfg.insert("ros".into(), Value::Table(ros));
    cfg
}

fn named(pairs: &[(&str, &str)]) -> Value {
    table(
        &pairs
            .iter()
            .map(|(k, v)| (*k, Value::String(v.to_string())))
            .collect::<Vec<_>>(),
    )
}

#[test]
fn when_the_model_camera_is_mapped_by_name_expect_check_to_pass() {
    let (code, text) = check_config(
        "cameras-ok",
        &ros_model(named(&[("front", "/camera/color/image_raw/compressed")])),
    );
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn when_a_camera_is_extra_expect_refused_naming_it_and_the_models_cameras() {
    let cfg = ros_model(named(&[
        ("front", "/front/compressed"),
        ("wrist", "/wrist/image_raw"),
    ]));
    let (code, text) = check_config("cameras-extra", &cfg);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("ros.cameras.wrist = \"/wrist/image_raw\": the model has no camera `wrist`")
            && text.contains("`front` (observation.images.front)")
            && text.contains("tiny-pi0/config.json"),
        "{text}"
    );
    // Two topics by position for a one-camera model.
    let list = Value::Array(vec![
        Value::String("/a/image_raw".into()),
        Value::String("/b/image_raw".into()),
    ]);
    let (code, text) = check_config("cameras-extra-list", &ros_model(list));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("ros.cameras[1] = \"/b/image_raw\": one camera too many"),
        "{text}"
    );
}

#[test]
fn when_a_camera_is_missing_expect_refused_unless_declared_optional() {
    let cfg = ros_model(named(&[]));
    let (code, text) = check_config("cameras-missing", &cfg);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("the model's camera `front` (observation.images.front in ")
            && text.contains("has no source")
            && text.contains("policy.optional_cameras"),
        "{text}"
    );
    let mut cfg = cfg;
    cfg["policy"].as_table_mut().unwrap().insert(
        "optional_cameras".into(),
        Value::Array(vec![Value::String("front".into())]),
    );
    let (code, text) = check_config("cameras-optional", &cfg);
    assert_eq!(code, Some(0), "{text}");
    // An optional camera the model does not have.
    cfg["policy"]["optional_cameras"] = Value::Array(vec![Value::String("top".into())]);
    let (code, text) = check_config("cameras-optional-unknown", &cfg);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("policy.optional_cameras: `top`"), "{text}");
}

#[test]
fn when_the_simulated_camera_has_another_name_expect_refused_naming_both() {
    let mut cfg = sim_model_config();
    cfg["sim"]["cameras"][0]["name"] = Value::String("top".into());
    let (code, text) = check_config("cameras-sim-name", &cfg);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("sim.cameras[0] (`top`): the model has no camera `top`")
            && text.contains("`front`"),
        "{text}"
    );
}

fn with_state(entries: Vec<Value>) -> toml::Table {
    let mut cfg = sim_model_config();
    cfg["policy"]
        .as_table_mut()
        .unwrap()
        .insert("state".into(), Value::Array(entries));
    cfg
}

fn joint(name: &str) -> Value {
    Value::String(name.into())
}

#[test]
fn when_the_state_layout_has_another_width_expect_refused_naming_the_feature() {
    // The seven joints and a constant: eight entries for a seven-entry state.
    let mut entries: Vec<Value> = [
        "shoulder_pan",
        "shoulder_lift",
        "elbow",
        "wrist_1",
        "wrist_2",
        "wrist_3",
        "gripper",
    ]
    .iter()
    .map(|n| joint(n))
    .collect();
    entries.push(Value::Float(0.0));
    let (code, text) = check_config("state-width", &with_state(entries));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("input_features.observation.state) has 7 entries")
            && text.contains("policy.state lists 8"),
        "{text}"
    );
}

#[test]
fn when_the_state_is_laid_out_apart_from_the_actions_expect_it_accepted_and_run() {
    // Another order than the actions, the gripper replaced by the constant the dataset held.
    let entries = vec![
        joint("wrist_3"),
        joint("shoulder_pan"),
        joint("shoulder_lift"),
        joint("elbow"),
        joint("wrist_1"),
        joint("wrist_2"),
        Value::Float(0.02),
    ];
    let cfg = with_state(entries);
    let (code, text) = check_config("state-ok", &cfg);
    assert_eq!(code, Some(0), "{text}");
    let run = run_daemon("state-run", &cfg, 3.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    assert!(
        run.summary()["chunks_accepted"].as_u64().unwrap() >= 2,
        "{}",
        run.stderr
    );
}

#[test]
fn when_the_state_names_an_unknown_joint_or_a_non_number_expect_refused_naming_the_entry() {
    let (code, text) = check_config(
        "state-unknown",
        &with_state(vec![joint("elbow"), joint("knee")]),
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("`policy.state[1]`: joint `knee` is not in robot.joints"),
        "{text}"
    );
    let (code, text) = check_config("state-bool", &with_state(vec![Value::Boolean(true)]));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("policy.state")
            && text.contains("a joint name (its measured position) or a number"),
        "{text}"
    );
}
