//! The daemon driving the simulated arm from a pi0.5 trained for real-time chunking (its
//! config.json's `rtc_training_max_delay`), with `[control.rtc]` on: after the first chunk
//! (plain), every chunk handed to the control loop was conditioned on the running chunk's
//! leftover as lerobot's trained mode conditions it. Its first `d` model actions (recorded beside
//! it, with `d`) are that leftover: the running chunk's plan at the new observation's step times,
//! normalized as the model's actions are. The golden fixture's pi0.5 weights, with quantile stats
//! around the simulator's start pose so its actions stay near it.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};

/// The simulator's start pose (config/sim.toml), action order.
const START: [f32; 7] = [0.0, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02];
/// The actions' quantile range around it: q01 = start - HALF, q99 = start + HALF.
const HALF: [f32; 7] = [0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.0005];
/// The delay the checkpoint takes at most (the fixture's 8 widened, so that a slow host's
/// latency stays within it: its weights are random either way).
const MAX_DELAY: usize = 40;

/// A normalizer's state file with its quantiles (state wide, actions narrow) around the start.
fn write_quantiles(path: &Path) {
    let around = |half: &[f32; 7], sign: f32| -> Vec<f32> {
        START.iter().zip(half).map(|(s, h)| s + sign * h).collect()
    };
    set_f32_tensors(path, |n| match n {
        "action.q01" => Some(around(&HALF, -1.0)),
        "action.q99" => Some(around(&HALF, 1.0)),
        "observation.state.q01" => Some(around(&[0.5; 7], -1.0)),
        "observation.state.q99" => Some(around(&[0.5; 7], 1.0)),
        _ => None,
    });
}

fn trained_checkpoint() -> TempDir {
    // The fixture's files are links to pi05_float32's: copied as regular files.
    let dir = copied_checkpoint(
        &root().join("tests/fixtures/pi05_float32_rtc8"),
        "trained-rtc-checkpoint",
    );
    edit_json(&dir.join("config.json"), |c| {
        c["rtc_training_max_delay"] = json!(MAX_DELAY)
    });
    write_quantiles(&dir.join("policy_preprocessor_step_3_normalizer_processor.safetensors"));
    write_quantiles(&dir.join("policy_postprocessor_step_0_unnormalizer_processor.safetensors"));
    dir
}

/// A recorded chunk: its observation (wall ns), step period, positions, and the model's own
/// output with the delay it was conditioned on.
struct Chunk {
    observation_ns: i64,
    period_s: f64,
    positions: Vec<Vec<f64>>,
    model: Vec<Vec<f32>>,
    delay: Option<usize>,
}

fn chunks(r: &Value) -> Vec<Chunk> {
    r["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Chunk {
            observation_ns: c["observation_ns"].as_i64().unwrap(),
            period_s: c["period_s"].as_f64().unwrap(),
            positions: serde_json::from_value(c["positions"].clone()).unwrap(),
            model: serde_json::from_value(c["model"]["actions"].clone()).unwrap(),
            delay: c["model"]["conditioned_delay"].as_u64().map(|d| d as usize),
        })
        .collect()
}

/// `old`'s plan at `stamp_ns + i * period` (linear between its steps), normalized as the
/// checkpoint normalizes actions (QUANTILES: 2 (x - q01) / (q99 - q01) - 1).
fn normalized_plan(old: &Chunk, stamp_ns: i64, i: usize) -> Vec<f64> {
    let k = (stamp_ns - old.observation_ns) as f64 * 1e-9 / old.period_s + i as f64;
    let last = (old.positions.len() - 1) as f64;
    let k = k.clamp(0.0, last);
    let lo = (k.floor() as usize).min(old.positions.len() - 2);
    let f = k - lo as f64;
    (0..7)
        .map(|j| {
            let x = old.positions[lo][j] + f * (old.positions[lo + 1][j] - old.positions[lo][j]);
            let (q01, q99) = (f64::from(START[j] - HALF[j]), f64::from(START[j] + HALF[j]));
            2.0 * (x - q01) / (q99 - q01) - 1.0
        })
        .collect()
}

#[test]
fn when_the_daemon_runs_a_pi05_trained_for_rtc_expect_each_chunk_conditioned_on_the_running_leftover(
) {
    let ck = trained_checkpoint();
    let mut cfg = sim_model_config();
    cfg["policy"]["checkpoint"] = toml::Value::String(ck.display().to_string());
    cfg["policy"].as_table_mut().unwrap().insert(
        "optional_cameras".into(),
        toml::Value::Array(vec![
            toml::Value::String("cam1".into()),
            toml::Value::String("cam2".into()),
        ]),
    );
    cfg["sim"]["cameras"][0]["name"] = toml::Value::String("cam0".into());
    // Steps of 50 ms: the trained delay (40 steps) then covers 2 s, so that a chunk inferred
    // on a busy host still arrives within the delay it was conditioned on (a later one is
    // discarded, as lerobot discards it).
    cfg["policy"]["step_period_s"] = toml::Value::Float(0.05);
    cfg["control"].as_table_mut().unwrap().insert(
        "rtc".into(),
        table(&[("enabled", toml::Value::Boolean(true))]),
    );
    let dir = scratch_dir("trained-rtc-run");
    let file = dir.join("run.mcap");
    cfg.insert(
        "record".into(),
        table(&[("path", toml::Value::String(file.display().to_string()))]),
    );
    let run = run_daemon("trained-rtc", &cfg, 8.0);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let recorded = chunks(&mcap_read_back_with(&file, &["--values"]));
    assert!(
        recorded.len() >= 3,
        "{} chunks, rejected: {}\n{}",
        recorded.len(),
        run.summary()["chunks_rejected_by_reason"],
        run.stderr
    );
    // The first chunk had no running chunk to be conditioned on: plain.
    assert_eq!(recorded[0].delay, None);
    let mut checked = 0;
    for (n, c) in recorded.iter().enumerate().skip(1) {
        let Some(d) = c.delay.filter(|d| *d > 0) else {
            continue;
        };
        assert!(d <= MAX_DELAY, "chunk {n}: conditioned on {d} steps");
        // Its first d model actions are the leftover of a chunk that ran before it (the latest
        // such: the one the control loop was executing when the observation was taken).
        let matches = |old: &Chunk| {
            (0..d).all(|i| {
                let want = normalized_plan(old, c.observation_ns, i);
                c.model[i]
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| (f64::from(*a) - b).abs() <= 1e-4)
            })
        };
        assert!(
            recorded[..n].iter().rev().any(matches),
            "chunk {n}: its first {d} actions {:?} are no earlier chunk's plan at its steps",
            &c.model[..d]
        );
        checked += 1;
    }
    // A host too busy to infer within the trained delay discards late chunks (lerobot's rule):
    // at least one conditioned chunk must have run to be checked.
    assert!(
        checked >= 1,
        "no conditioned chunk to check; rejected: {}",
        run.summary()["chunks_rejected_by_reason"]
    );
}
