//! pi0 as the daemon's policy (`Policy`): the pipeline with fresh noise for every chunk.

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::pipeline::{Backend, Pi0Pipeline};
use crate::chunk::{ActionChunk, ChunkPrefix};
use crate::observation::{CameraFrame, Observation};
use crate::policy::rtc::RtcSettings;
use crate::policy::{Policy, PolicyError, StageTiming};

/// pi0 as the daemon's policy: samples fresh noise for every chunk.
pub(crate) struct Pi0Policy {
    pipeline: Pi0Pipeline,
    rng: rand::rngs::StdRng,
    step_period_s: f64,
    /// Real-time chunking: guide each chunk towards the observation's leftover.
    rtc: Option<RtcSettings>,
    /// The configuration's names of the actions (for `describe`).
    action_names: Vec<String>,
}

impl Pi0Policy {
    pub(crate) fn new(pipeline: Pi0Pipeline, step_period_s: f64, seed: u64) -> Pi0Policy {
        Pi0Policy {
            pipeline,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            step_period_s,
            rtc: None,
            action_names: Vec::new(),
        }
    }

    pub(crate) fn with_action_names(mut self, names: Vec<String>) -> Pi0Policy {
        self.action_names = names;
        self
    }

    pub(crate) fn with_rtc(mut self, rtc: Option<RtcSettings>) -> Pi0Policy {
        self.rtc = rtc;
        self
    }
}

impl Policy for Pi0Policy {
    fn name(&self) -> &str {
        "pi0"
    }

    fn stage_timing(&self) -> Option<StageTiming> {
        Some(self.pipeline.last_stages)
    }

    fn describe(&self) -> Vec<String> {
        self.pipeline.processor.describe(&self.action_names)
    }

    fn weight_bytes(&self) -> Option<u64> {
        match &self.pipeline.backend {
            Backend::Cpu { model, .. } => Some(model.weight_bytes()),
            Backend::Graph(..) => None,
        }
    }

    fn warm_up(&mut self, obs: &Observation) -> Result<(), PolicyError> {
        let mut obs = obs.clone();
        obs.rtc = None;
        self.infer(&obs).map(|_| ())
    }

    fn infer(&mut self, obs: &Observation) -> Result<ActionChunk, PolicyError> {
        let p = &mut self.pipeline;
        let a = &p.arch;
        let noise: Vec<f32> = (0..a.chunk * a.action_dim)
            .map(|_| StandardNormal.sample(&mut self.rng))
            .collect();
        let frames: Vec<Option<&CameraFrame>> = obs.images.iter().map(|f| f.as_deref()).collect();
        let state: Vec<f32> = obs.state.iter().map(|x| *x as f32).collect();
        let conditioning = match (self.rtc, &obs.rtc) {
            (Some(settings), Some(prefix)) => {
                let prefix = match p.trained_rtc() {
                    Some(max) => trained_delay(prefix, max),
                    None => prefix.clone(),
                };
                Some(
                    p.conditioning(settings, &prefix, &state)
                        .map_err(PolicyError::Guidance)?,
                )
            }
            _ => None,
        };
        let (actions, _) = p
            .run_guided(&frames, &state, &obs.prompt, &noise, conditioning.as_ref())
            .map_err(PolicyError::Model)?;
        Ok(ActionChunk {
            obs_stamp: obs.stamp,
            step_period_s: self.step_period_s,
            action_dim: p.action_dim,
            actions: actions.iter().flatten().map(|x| *x as f64).collect(),
            model: p.last_output.take().map(Box::new),
        })
    }
}

/// The delay a model trained for real-time chunking is conditioned on, as lerobot's rollout
/// picks it: the planner's estimate (the largest recent latency in steps), the trained maximum
/// before any latency is known, never more than the maximum or the leftover's steps.
fn trained_delay(prefix: &ChunkPrefix, max: usize) -> ChunkPrefix {
    let d = match prefix.inference_delay {
        0 => max,
        d => d,
    };
    ChunkPrefix {
        inference_delay: d.min(max).min(prefix.steps()),
        ..prefix.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(steps: usize, delay: usize) -> ChunkPrefix {
        ChunkPrefix {
            actions: vec![0.0; steps * 2],
            action_dim: 2,
            inference_delay: delay,
            execution_horizon: 10,
        }
    }

    #[test]
    fn when_a_trained_model_is_conditioned_expect_lerobots_delay_rules() {
        // Before any latency is known, the trained maximum (lerobot's bootstrap).
        assert_eq!(trained_delay(&prefix(40, 0), 8).inference_delay, 8);
        // The planner's estimate, capped at the maximum and at the leftover's steps.
        assert_eq!(trained_delay(&prefix(40, 3), 8).inference_delay, 3);
        assert_eq!(trained_delay(&prefix(40, 12), 8).inference_delay, 8);
        assert_eq!(trained_delay(&prefix(5, 7), 8).inference_delay, 5);
    }
}
