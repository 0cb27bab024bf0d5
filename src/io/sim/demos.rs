//! Scripted demonstrations of the simulator's task (`[sim.task]`), for training a policy on
//! exactly what the simulator shows: episode after episode, a new target is drawn, the expert
//! moves the arm to the target's pose and holds it there, and each step's camera images, joint
//! positions and commanded positions are written, one safetensors file per episode
//! (`tools/sim_task.py` turns them into a lerobot dataset).
//!
//! The expert depends on where the arm is and where the target is, not on time: from any pose
//! it heads straight (in joint space) for the target, at a speed that ramps up, cruises and
//! slows exponentially as it arrives. A policy that replans mid-motion therefore sees the same
//! future from the same picture, whenever it asks.

use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::scene::Scene;
use super::task::Targets;
use super::{next_episode, SimArm};
use crate::config::Config;
use crate::joints::JointVector;

/// The expert's speed profile (joint space; rad/s, rad/s², s).
const CRUISE: f64 = 1.2;
const RAMP: f64 = 4.0;
const ARRIVAL_TIME_CONSTANT: f64 = 0.3;
/// Episodes run on from where the last one ended; every this many the arm starts afresh at
/// `sim.initial_position`.
const RESET_EVERY: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{file}: the configuration has no [sim.task] to demonstrate")]
    NoTask { file: PathBuf },
    #[error("{file}: [sim] has no camera to record")]
    NoCamera { file: PathBuf },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serialize {path}")]
    Serialize {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
}

/// How many episodes, how long, and the target sequence's seed.
#[derive(Clone, Copy, Debug)]
pub struct DemoOptions {
    pub episodes: usize,
    pub episode_s: f64,
    pub seed: u64,
}

/// What was written.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DemoReport {
    pub episodes: usize,
    pub frames: usize,
    /// Episodes whose tool ended within the task's radius of the target.
    pub reached: usize,
}

/// One step of the expert: the next commanded pose from `command` toward `goal`; `speed` is
/// the speed it moved at last step (rad/s).
fn expert_step(command: &JointVector, goal: &JointVector, speed: &mut f64, dt: f64) -> JointVector {
    let n = command.len();
    let dist = (0..n)
        .map(|j| (goal[j] - command[j]).powi(2))
        .sum::<f64>()
        .sqrt();
    if dist < 1e-9 {
        *speed = 0.0;
        return *goal;
    }
    *speed = CRUISE
        .min(dist / ARRIVAL_TIME_CONSTANT)
        .min(*speed + RAMP * dt);
    let step = (*speed * dt).min(dist);
    let mut next = *command;
    for j in 0..n {
        next[j] += (goal[j] - command[j]) / dist * step;
    }
    next
}

/// Writes `opts.episodes` demonstrations of `cfg`'s task into `out` (created).
pub fn write_demonstrations(
    cfg: &Config,
    opts: DemoOptions,
    out: &Path,
) -> Result<DemoReport, DemoError> {
    let Some(task) = cfg.sim.task.clone() else {
        return Err(DemoError::NoTask {
            file: cfg.file.clone(),
        });
    };
    let Some(camera) = cfg.sim.cameras.first().cloned() else {
        return Err(DemoError::NoCamera {
            file: cfg.file.clone(),
        });
    };
    std::fs::create_dir_all(out).map_err(|source| DemoError::Write {
        path: out.into(),
        source,
    })?;
    let scene = Scene::new(task);
    let mut targets = Targets::new(opts.seed);
    // The arm's dynamics only: the demonstrations draw their own targets.
    let sim = crate::config::SimConfig {
        task: None,
        ..cfg.sim.clone()
    };
    let mut arm = SimArm::new(sim, &cfg.limits);
    let base = cfg.sim.initial_position;
    let dt = cfg.policy.step_period_s;
    let frame_every = (1.0 / (camera.fps * dt)).round().max(1.0) as usize;
    let steps = (opts.episode_s / dt).round() as usize;
    let (w, h) = (camera.width as usize, camera.height as usize);
    let n = base.len();
    let mut report = DemoReport {
        episodes: 0,
        frames: 0,
        reached: 0,
    };
    let mut command = arm.position;
    let mut frame = vec![0u8; w * h * 3];
    for e in 0..opts.episodes {
        if e % RESET_EVERY == 0 {
            // From where a run starts, now and then: pi0d's first target starts there.
            arm.position = base;
            command = base;
        }
        let episode = next_episode(&scene, &mut targets, &base, 0.0);
        let goal = episode.pose;
        let mut images = Vec::with_capacity(steps * w * h * 3);
        let mut states = Vec::with_capacity(steps * n);
        let mut actions = Vec::with_capacity(steps * n);
        let mut speed = 0.0;
        for k in 0..steps {
            if k % frame_every == 0 {
                scene.render(arm.position.as_slice(), Some(episode.xy), w, h, &mut frame);
            }
            images.extend_from_slice(&frame);
            states.extend(arm.position.as_slice().iter().map(|&x| x as f32));
            let next = expert_step(&command, &goal, &mut speed, dt);
            actions.extend(next.as_slice().iter().map(|&x| x as f32));
            arm.follow(&command, &next, dt);
            command = next;
        }
        if episode.distance(scene.tool_xy(arm.position.as_slice())) <= scene.task().radius_m {
            report.reached += 1;
        }
        let path = out.join(format!("episode_{e:05}.safetensors"));
        write_episode(&path, &camera.name, (w, h), &images, &states, &actions, n)?;
        report.episodes += 1;
        report.frames += steps;
    }
    Ok(report)
}

fn write_episode(
    path: &Path,
    camera: &str,
    (w, h): (usize, usize),
    images: &[u8],
    states: &[f32],
    actions: &[f32],
    n: usize,
) -> Result<(), DemoError> {
    let steps = states.len() / n;
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (s, a) = (f32s(states), f32s(actions));
    let ser = |source| DemoError::Serialize {
        path: path.into(),
        source,
    };
    let image_key = format!("observation.images.{camera}");
    let views = vec![
        (
            image_key,
            TensorView::new(Dtype::U8, vec![steps, h, w, 3], images).map_err(ser)?,
        ),
        (
            "observation.state".to_string(),
            TensorView::new(Dtype::F32, vec![steps, n], &s).map_err(ser)?,
        ),
        (
            "action".to_string(),
            TensorView::new(Dtype::F32, vec![steps, n], &a).map_err(ser)?,
        ),
    ];
    safetensors::serialize_to_file(views, None, path).map_err(ser)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_the_expert_runs_expect_it_to_arrive_within_its_ramp_and_cruise_limits() {
        let start = JointVector::from_slice(&[0.0, 0.3, 0.6]);
        let goal = JointVector::from_slice(&[1.5, 0.7, 1.0]);
        let (mut c, mut speed, dt) = (start, 0.0, 0.02);
        let mut last_speed = 0.0f64;
        for _ in 0..200 {
            let next = expert_step(&c, &goal, &mut speed, dt);
            let moved = (0..3).map(|j| (next[j] - c[j]).powi(2)).sum::<f64>().sqrt() / dt;
            assert!(moved <= CRUISE + 1e-9, "{moved} rad/s");
            assert!(
                moved - last_speed <= RAMP * dt + 1e-9,
                "{moved} after {last_speed}"
            );
            last_speed = moved;
            c = next;
        }
        assert!((0..3).all(|j| (c[j] - goal[j]).abs() < 1e-3), "{c:?}");
    }

    #[test]
    fn when_asked_from_a_pose_on_its_way_expect_the_same_next_pose_as_on_the_way() {
        // Markov in the pose while cruising: the replanning policy sees what the data shows.
        let goal = JointVector::from_slice(&[1.5, 0.7]);
        let mut c = JointVector::from_slice(&[0.0, 0.3]);
        let mut speed = 0.0;
        for _ in 0..20 {
            c = expert_step(&c, &goal, &mut speed, 0.02);
        }
        assert!((speed - CRUISE).abs() < 1e-9);
        let mut fresh = CRUISE;
        let a = expert_step(&c, &goal, &mut speed, 0.02);
        let b = expert_step(&c, &goal, &mut fresh, 0.02);
        assert_eq!(a, b);
    }
}
