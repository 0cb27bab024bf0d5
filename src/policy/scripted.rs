//! A smooth scripted motion: each driven joint swings `A (1 - cos ωt) / 2` away from where it
//! stood at the first observation, toward the side with more room, at slightly different
//! frequencies so the joints do not move in lockstep.

use std::time::Duration;

use super::{Policy, PolicyError};
use crate::chunk::ActionChunk;
use crate::joints::ActionMap;
use crate::observation::Observation;
use crate::robot::RobotLimits;
use crate::time::MonoTime;

pub(crate) struct ScriptedPolicy {
    lower: Vec<f64>,
    upper: Vec<f64>,
    amplitude: f64,
    omega: f64,
    steps: usize,
    period_s: f64,
    latency: Duration,
    /// (start time, start position, signed amplitude per action) fixed at the first observation.
    origin: Option<(MonoTime, Vec<f64>, Vec<f64>)>,
}

impl ScriptedPolicy {
    pub(crate) fn new(
        limits: &RobotLimits,
        map: &ActionMap,
        amplitude: f64,
        frequency_hz: f64,
        steps: usize,
        period_s: f64,
        latency_s: f64,
    ) -> ScriptedPolicy {
        ScriptedPolicy {
            lower: map
                .joint_of_action
                .iter()
                .map(|&j| limits.lower[j])
                .collect(),
            upper: map
                .joint_of_action
                .iter()
                .map(|&j| limits.upper[j])
                .collect(),
            amplitude,
            omega: 2.0 * std::f64::consts::PI * frequency_hz,
            steps,
            period_s,
            // Saturates: `policy.latency_s` is ranged, but a huge value must not panic here.
            latency: Duration::try_from_secs_f64(latency_s).unwrap_or(Duration::MAX),
            origin: None,
        }
    }

    fn swing(&self, start: &[f64]) -> Vec<f64> {
        start
            .iter()
            .enumerate()
            .map(|(k, &s)| {
                let (lo, hi) = (self.lower[k], self.upper[k]);
                let up_room = (hi - s).min(1e3);
                let down_room = (s - lo).min(1e3);
                let a = self.amplitude.min(0.8 * up_room.max(down_room)).max(0.0);
                if up_room >= down_room {
                    a
                } else {
                    -a
                }
            })
            .collect()
    }
}

impl Policy for ScriptedPolicy {
    fn name(&self) -> &str {
        "scripted"
    }

    fn infer(&mut self, obs: &Observation) -> Result<ActionChunk, PolicyError> {
        if self.latency > Duration::ZERO {
            std::thread::sleep(self.latency);
        }
        if obs.state.len() != self.lower.len() {
            return Err(PolicyError::WrongDimension {
                expected: self.lower.len(),
                found: obs.state.len(),
            });
        }
        let origin = match self.origin.take() {
            Some(o) => o,
            None => (obs.stamp, obs.state.clone(), self.swing(&obs.state)),
        };
        let (t0, start, swing) = &*self.origin.insert(origin);
        let dim = start.len();
        let mut actions = Vec::with_capacity(self.steps * dim);
        for i in 0..self.steps {
            let t = obs.stamp.seconds_since(*t0) + i as f64 * self.period_s;
            for k in 0..dim {
                let w = self.omega * (1.0 + 0.15 * k as f64);
                actions.push(start[k] + swing[k] * 0.5 * (1.0 - (w * t).cos()));
            }
        }
        Ok(ActionChunk {
            obs_stamp: obs.stamp,
            step_period_s: self.period_s,
            action_dim: dim,
            actions,
            model: None,
        })
    }

    /// Costs what an inference costs (`policy.latency_s`), as a model's warm-up does; the
    /// motion's origin is left to the first real chunk.
    fn warm_up(&mut self, _obs: &Observation) -> Result<(), PolicyError> {
        std::thread::sleep(self.latency);
        Ok(())
    }
}
