//! The bundled demo model (config/sim.toml: models/sim-reach) doing its task in the
//! simulator, closed loop in simulated time: the simulator's arm, scene and targets, pi0d's
//! own pi0 on the CPU, each chunk checked as the daemon checks it on arrival (a refused one
//! leaves the running chunk in charge) and executed for the steps the daemon executes before
//! the next one takes over, then a new observation. No clock and no threads: the same on any
//! host.

use std::path::Path;
use std::sync::Arc;

use crate::chunk::JointChunk;
use crate::config::Config;
use crate::io::sim::scene::Scene;
use crate::io::sim::task::{Outcome, Targets};
use crate::io::sim::{next_episode, SimArm};
use crate::observation::{CameraFrame, Observation, PixelFormat};
use crate::safety::validate::check_chunk;
use crate::time::MonoTime;

/// Targets the training never saw (its demonstrations used seed 0).
const SEED: u64 = 1000;
const TARGETS: usize = 20;

#[test]
fn when_the_bundled_demo_model_runs_expect_it_to_reach_targets_it_never_saw() {
    let cfg = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim.toml")).unwrap();
    let task = cfg.sim.task.clone().unwrap();
    let camera = cfg.sim.cameras[0].clone();
    let (w, h) = (camera.width as usize, camera.height as usize);
    let mut policy = crate::policy::from_config(&cfg).unwrap();
    let mut arm = SimArm::new(cfg.sim.clone(), &cfg.limits);
    let scene = Scene::new(task.clone());
    let mut targets = Targets::new(SEED);
    let base = cfg.sim.initial_position;
    let dt = cfg.policy.step_period_s;
    // The daemon asks for the next chunk control.request_threshold_s before the running one
    // ends: what runs of each chunk before the next one takes over.
    let horizon = cfg.policy.chunk_steps as f64 * dt;
    let executed = ((horizon - cfg.control.request_threshold_s) / dt).round() as usize;
    let mut reached = Vec::new();
    let mut refused = 0;
    let mut t = 0.0;
    let mut running = JointChunk::with_capacity(cfg.policy.chunk_steps);
    let mut next_step = usize::MAX;
    for _ in 0..TARGETS {
        let mut episode = next_episode(&scene, &mut targets, &base, t);
        let mut last = *arm.position();
        let (off, outcome) = loop {
            let mut data = vec![0u8; w * h * 3];
            scene.render(arm.position().as_slice(), Some(episode.xy), w, h, &mut data);
            let stamp = MonoTime::ZERO.offset_seconds(1.0 + t);
            let frame = CameraFrame {
                stamp,
                width: camera.width,
                height: camera.height,
                format: PixelFormat::Rgb8,
                data,
            };
            let obs = Observation {
                stamp,
                state: arm.position().as_slice().to_vec(),
                images: vec![Some(Arc::new(frame))],
                prompt: cfg.policy.prompt.clone(),
                rtc: None,
            };
            let chunk = policy.infer(&obs).unwrap();
            let mut fresh = JointChunk::with_capacity(chunk.steps());
            fresh.fill_from(&chunk, &cfg.policy.action_map, arm.position(), 0);
            let s = &cfg.safety;
            match check_chunk(
                &fresh,
                &cfg.limits,
                s.chunk_position_tolerance,
                s.chunk_step_velocity_factor,
            ) {
                Ok(()) => {
                    running = fresh;
                    next_step = 0;
                }
                Err(_) => refused += 1,
            }
            let mut done = None;
            for _ in 0..executed {
                // Past the running chunk's end the command holds (the daemon decelerates and
                // holds until a chunk passes its checks).
                let next = match running.positions.get(next_step) {
                    Some(p) => {
                        next_step += 1;
                        *p
                    }
                    None => last,
                };
                arm.follow(&last, &next, dt);
                last = next;
                t += dt;
                let tool = scene.tool_xy(arm.position().as_slice());
                let (d, outcome) = episode.observe(&task, tool, t);
                if outcome != Outcome::Going {
                    done = Some((d, outcome));
                    break;
                }
            }
            if let Some(d) = done {
                break d;
            }
        };
        eprintln!(
            "target at ({:.3}, {:.3}) m: {outcome:?}, {:.0} mm off",
            episode.xy[0],
            episode.xy[1],
            off * 1e3
        );
        reached.push(outcome == Outcome::Reached);
    }
    let n = reached.iter().filter(|r| **r).count();
    eprintln!("the demo model reached {n} of {TARGETS} targets ({refused} chunks refused)");
    assert!(
        n * 5 >= TARGETS * 3,
        "reached {n} of {TARGETS}: {reached:?}"
    );
}
