//! Replays recorded chunks from a JSON file: `{"step_period_s": 0.02, "chunks": [[[a0, a1, ...],
//! ...], ...]}`, absolute targets in the policy's action order, cycled in order.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{Observation, Policy, PolicyBuildError, PolicyError};
use crate::control::ActionChunk;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayFile {
    step_period_s: f64,
    chunks: Vec<Vec<Vec<f64>>>,
}

pub struct ReplayPolicy {
    period_s: f64,
    chunks: Vec<Vec<f64>>,
    dim: usize,
    next: usize,
    latency: Duration,
}

impl ReplayPolicy {
    pub fn load(file: &Path, dim: usize, latency_s: f64) -> Result<ReplayPolicy, PolicyBuildError> {
        let err = |message: String| PolicyBuildError::Replay {
            file: file.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(file).map_err(|e| err(e.to_string()))?;
        let raw: ReplayFile = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if !(raw.step_period_s > 0.0 && raw.step_period_s.is_finite()) {
            return Err(err(format!(
                "step_period_s must be > 0, found {}",
                raw.step_period_s
            )));
        }
        if raw.chunks.is_empty() {
            return Err(err("chunks: expected at least one chunk".into()));
        }
        let mut chunks = Vec::new();
        for (c, chunk) in raw.chunks.iter().enumerate() {
            if chunk.len() < 2 {
                return Err(err(format!(
                    "chunks[{c}]: expected at least 2 steps, found {}",
                    chunk.len()
                )));
            }
            let mut flat = Vec::with_capacity(chunk.len() * dim);
            for (s, step) in chunk.iter().enumerate() {
                if step.len() != dim {
                    return Err(err(format!(
                        "chunks[{c}][{s}]: expected {dim} values (policy.action_joints), found {}",
                        step.len()
                    )));
                }
                flat.extend_from_slice(step);
            }
            chunks.push(flat);
        }
        Ok(ReplayPolicy {
            period_s: raw.step_period_s,
            chunks,
            dim,
            next: 0,
            latency: Duration::from_secs_f64(latency_s),
        })
    }
}

impl Policy for ReplayPolicy {
    fn name(&self) -> &str {
        "replay"
    }

    fn infer(&mut self, obs: &Observation) -> Result<ActionChunk, PolicyError> {
        if self.latency > Duration::ZERO {
            std::thread::sleep(self.latency);
        }
        let actions = self.chunks[self.next].clone();
        self.next = (self.next + 1) % self.chunks.len();
        Ok(ActionChunk {
            obs_stamp: obs.stamp,
            step_period_s: self.period_s,
            action_dim: self.dim,
            actions,
        })
    }
}
