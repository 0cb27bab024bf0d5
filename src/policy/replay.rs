//! Replays recorded chunks from a JSON file: `{"step_period_s": 0.02, "chunks": [[[a0, a1, ...],
//! ...], ...]}`, absolute targets in the policy's action order, cycled in order.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{Policy, PolicyBuildError, PolicyError};
use crate::chunk::ActionChunk;
use crate::observation::Observation;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayFile {
    step_period_s: f64,
    chunks: Vec<Vec<Vec<f64>>>,
}

pub(crate) struct ReplayPolicy {
    period_s: f64,
    chunks: Vec<Vec<f64>>,
    dim: usize,
    next: usize,
    latency: Duration,
}

impl ReplayPolicy {
    pub(crate) fn load(
        file: &Path,
        dim: usize,
        latency_s: f64,
    ) -> Result<ReplayPolicy, PolicyBuildError> {
        let err = |message: String| PolicyBuildError::Replay {
            file: file.display().to_string(),
            message,
        };
        // A regular file of at most 64 MiB: a FIFO or a device would block or never end.
        let text = crate::files::read_regular(file, 64 << 20).map_err(|e| err(e.to_string()))?;
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
            // Saturates: `policy.latency_s` is ranged, but a huge value must not panic here.
            latency: Duration::try_from_secs_f64(latency_s).unwrap_or(Duration::MAX),
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
            model: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;

    /// `text` as `<dir>/<name>.json` in a directory removed when the guard is dropped.
    fn write(name: &str, text: &str) -> (crate::test_dirs::TempDir, std::path::PathBuf) {
        let dir = crate::test_dirs::TempDir::new(&format!("replay-{name}"));
        let p = dir.join(format!("{name}.json"));
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn when_replaying_expect_chunks_in_order_stamped_with_the_observation() {
        let (_dir, f) = write(
            "ok",
            r#"{"step_period_s": 0.02, "chunks": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]}"#,
        );
        let mut p = ReplayPolicy::load(&f, 2, 0.0).unwrap();
        let obs = Observation {
            stamp: MonoTime::from_nanos(42),
            ..Observation::default()
        };
        let a = p.infer(&obs).unwrap();
        let b = p.infer(&obs).unwrap();
        let c = p.infer(&obs).unwrap();
        assert_eq!(a.actions, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(b.actions, vec![5.0, 6.0, 7.0, 8.0]);
        assert_eq!(c.actions, a.actions, "cycles");
        assert_eq!(a.obs_stamp, obs.stamp);
        assert_eq!(a.step_period_s, 0.02);
    }

    #[test]
    fn when_replay_step_has_wrong_width_expect_error_naming_file_and_place() {
        let (_dir, f) = write(
            "bad",
            r#"{"step_period_s": 0.02, "chunks": [[[1, 2], [3]]]}"#,
        );
        let e = ReplayPolicy::load(&f, 2, 0.0).err().unwrap().to_string();
        assert!(
            e.contains("pi0d-replay")
                && e.contains("chunks[0][1]")
                && e.contains("expected 2 values"),
            "{e}"
        );
    }
}
