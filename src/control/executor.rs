//! Executes joint-space chunks against the monotonic clock.
//!
//! Step `i` of a chunk is due at `obs_stamp + i * period`, so the steps that passed while the
//! policy was thinking are skipped by construction. A new chunk takes over from the current
//! commanded state through a quintic correction that starts at the commanded position, velocity
//! and acceleration and fades to zero (with zero velocity and acceleration) over the blend window:
//! the commanded trajectory stays C2 across every switch.

use super::chunk::JointChunk;
use super::interpolate::{quintic_basis, sample};
use crate::config::{Interpolation, MergeMode};
use crate::joints::{JointVector, MotionState};
use crate::time::MonoTime;

/// Why a chunk was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRejection {
    /// Too few steps left in the future to execute.
    Stale,
    /// Computed from an older observation than the chunk being executed.
    OutOfOrder,
}

#[derive(Clone, Copy, Debug)]
struct Blend {
    start: MonoTime,
    window_s: f64,
    /// Commanded minus new-chunk position, velocity and acceleration at `start`.
    offset: MotionState,
}

pub struct Executor {
    interpolation: Interpolation,
    merge: MergeMode,
    blend_window_s: f64,
    min_window_s: f64,
    active: Option<Box<JointChunk>>,
    blend: Option<Blend>,
    scratch: JointVector,
}

/// Finite-difference step for the new chunk's derivatives at the switch time.
const DERIVATIVE_STEP_S: f64 = 1e-3;

impl Executor {
    /// `control_period_s` bounds the shortest transition (used by `latest_only`).
    pub fn new(
        interpolation: Interpolation,
        merge: MergeMode,
        blend_window_s: f64,
        control_period_s: f64,
    ) -> Executor {
        Executor {
            interpolation,
            merge,
            blend_window_s,
            min_window_s: 2.0 * control_period_s,
            active: None,
            blend: None,
            scratch: JointVector::zeros(0),
        }
    }

    pub fn has_chunk(&self) -> bool {
        self.active.is_some()
    }

    pub fn active_obs_stamp(&self) -> Option<MonoTime> {
        self.active.as_ref().map(|c| c.obs_stamp)
    }

    /// Seconds of chunk left after `now` (0 when none).
    pub fn remaining_s(&self, now: MonoTime) -> f64 {
        self.active
            .as_ref()
            .map_or(0.0, |c| c.end().seconds_since(now).max(0.0))
    }

    /// Drops the active chunk (hold, e-stop); returns it for recycling.
    pub fn clear(&mut self) -> Option<Box<JointChunk>> {
        self.blend = None;
        self.active.take()
    }

    /// Takes over `chunk` at the tick following `last_tick`, where the commanded state was
    /// `commanded`. Returns the chunk it replaces (for recycling), or gives `chunk` back with the
    /// reason it was refused.
    #[allow(clippy::type_complexity)]
    pub fn accept(
        &mut self,
        mut chunk: Box<JointChunk>,
        now: MonoTime,
        last_tick: MonoTime,
        commanded: &MotionState,
    ) -> Result<Option<Box<JointChunk>>, (Box<JointChunk>, ChunkRejection)> {
        // At least one full step must remain ahead of us to be worth executing.
        if chunk.end().seconds_since(now) < chunk.period_s {
            return Err((chunk, ChunkRejection::Stale));
        }
        if let Some(active) = &self.active {
            if chunk.obs_stamp <= active.obs_stamp {
                return Err((chunk, ChunkRejection::OutOfOrder));
            }
            if let MergeMode::WeightedAverage { old_weight } = self.merge {
                self.average_overlap(&mut chunk, active_ref(&self.active), old_weight);
            }
        }
        let window_s = match self.merge {
            MergeMode::LatestOnly => self.min_window_s,
            _ => self.blend_window_s,
        };
        // The new chunk's position, velocity and acceleration where the commanded state stands.
        let ts = last_tick.seconds_since(chunk.obs_stamp);
        let mode = self.interpolation;
        let mut f0 = JointVector::zeros(0);
        let mut fm = JointVector::zeros(0);
        let mut fp = JointVector::zeros(0);
        sample(&chunk, mode, ts, &mut f0);
        sample(&chunk, mode, ts - DERIVATIVE_STEP_S, &mut fm);
        sample(&chunk, mode, ts + DERIVATIVE_STEP_S, &mut fp);
        let mut offset = *commanded;
        let d = DERIVATIVE_STEP_S;
        for j in 0..f0.len() {
            let vel = (fp[j] - fm[j]) / (2.0 * d);
            let acc = (fp[j] - 2.0 * f0[j] + fm[j]) / (d * d);
            offset.position[j] = commanded.position[j] - f0[j];
            offset.velocity[j] = commanded.velocity[j] - vel;
            offset.acceleration[j] = commanded.acceleration[j] - acc;
        }
        self.blend = Some(Blend {
            start: last_tick,
            window_s,
            offset,
        });
        Ok(self.active.replace(chunk))
    }

    /// LeRobot's weighted average of overlapping steps, resampled on the new chunk's step times.
    fn average_overlap(&self, new: &mut JointChunk, old: &JointChunk, old_weight: f64) {
        let mut old_p = JointVector::zeros(0);
        for i in 0..new.steps() {
            let t = new.obs_stamp.offset_seconds(i as f64 * new.period_s);
            if t < old.obs_stamp || t > old.end() {
                continue;
            }
            sample(
                old,
                self.interpolation,
                t.seconds_since(old.obs_stamp),
                &mut old_p,
            );
            let p = &mut new.positions[i];
            for j in 0..p.len() {
                p[j] = old_weight * old_p[j] + (1.0 - old_weight) * p[j];
            }
        }
        new.update_derivatives();
    }

    /// Target position at `now`; `None` when there is no chunk or it has run out.
    pub fn target(&mut self, now: MonoTime) -> Option<&JointVector> {
        let chunk = self.active.as_ref()?;
        if now > chunk.end() {
            return None;
        }
        let t = now.seconds_since(chunk.obs_stamp);
        sample(chunk, self.interpolation, t, &mut self.scratch);
        if let Some(b) = &self.blend {
            let s = now.seconds_since(b.start);
            if s >= b.window_s {
                self.blend = None;
            } else {
                let w = b.window_s;
                let basis = quintic_basis((s / w).max(0.0));
                for j in 0..self.scratch.len() {
                    self.scratch[j] += basis[0] * b.offset.position[j]
                        + basis[1] * w * b.offset.velocity[j]
                        + basis[2] * w * w * b.offset.acceleration[j];
                }
            }
        }
        Some(&self.scratch)
    }
}

fn active_ref(active: &Option<Box<JointChunk>>) -> &JointChunk {
    active.as_deref().expect("checked by caller")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear_chunk(obs: MonoTime, start: f64, slope: f64, steps: usize) -> Box<JointChunk> {
        let mut c = JointChunk::with_capacity(steps);
        c.obs_stamp = obs;
        c.period_s = 0.02;
        for i in 0..steps {
            c.positions
                .push(JointVector::from_slice(&[start + slope * i as f64 * 0.02]));
        }
        c.update_derivatives();
        Box::new(c)
    }

    fn t(s: f64) -> MonoTime {
        MonoTime::from_nanos(10_000_000_000).offset_seconds(s)
    }

    #[test]
    fn when_chunk_arrives_late_expect_past_steps_skipped() {
        let mut ex = Executor::new(Interpolation::Linear, MergeMode::Blend, 0.1, 0.005);
        let chunk = linear_chunk(t(0.0), 0.0, 1.0, 50);
        // Arrives 0.3 s after its observation while the arm stands exactly where step 15 is.
        let state = MotionState {
            position: JointVector::from_slice(&[0.3 - 0.005]),
            velocity: JointVector::from_slice(&[1.0]),
            acceleration: JointVector::zeros(1),
        };
        ex.accept(chunk, t(0.3), t(0.295), &state).unwrap();
        let p = ex.target(t(0.3)).unwrap()[0];
        assert!((p - 0.3).abs() < 1e-9, "{p}");
    }

    #[test]
    fn when_whole_chunk_in_past_expect_rejected_stale() {
        let mut ex = Executor::new(Interpolation::Linear, MergeMode::Blend, 0.1, 0.005);
        let chunk = linear_chunk(t(0.0), 0.0, 1.0, 50);
        let state = MotionState::at_rest(JointVector::zeros(1));
        let (_, why) = ex.accept(chunk, t(1.5), t(1.495), &state).unwrap_err();
        assert_eq!(why, ChunkRejection::Stale);
    }

    #[test]
    fn when_switching_chunks_expect_blend_to_start_from_commanded_state() {
        let mut ex = Executor::new(Interpolation::Quintic, MergeMode::Blend, 0.2, 0.005);
        let state = MotionState::at_rest(JointVector::from_slice(&[0.5]));
        ex.accept(linear_chunk(t(0.0), 0.0, 0.0, 50), t(0.1), t(0.095), &state)
            .unwrap();
        // Right after the switch we are still next to 0.5, after the window on the chunk (0.0).
        let p = ex.target(t(0.1)).unwrap()[0];
        assert!((p - 0.5).abs() < 0.01, "{p}");
        let p = ex.target(t(0.31)).unwrap()[0];
        assert!(p.abs() < 1e-12, "{p}");
    }

    #[test]
    fn when_older_observation_arrives_expect_out_of_order() {
        let mut ex = Executor::new(Interpolation::Cubic, MergeMode::Blend, 0.1, 0.005);
        let state = MotionState::at_rest(JointVector::zeros(1));
        ex.accept(
            linear_chunk(t(0.2), 0.0, 0.0, 50),
            t(0.25),
            t(0.245),
            &state,
        )
        .unwrap();
        let (_, why) = ex
            .accept(linear_chunk(t(0.1), 0.0, 0.0, 50), t(0.3), t(0.295), &state)
            .unwrap_err();
        assert_eq!(why, ChunkRejection::OutOfOrder);
    }

    #[test]
    fn when_weighted_average_expect_overlap_mixed_with_old_weight() {
        let mut ex = Executor::new(
            Interpolation::Linear,
            MergeMode::WeightedAverage { old_weight: 0.3 },
            0.04,
            0.005,
        );
        let state = MotionState::at_rest(JointVector::from_slice(&[1.0]));
        ex.accept(
            linear_chunk(t(0.0), 1.0, 0.0, 50),
            t(0.01),
            t(0.005),
            &state,
        )
        .unwrap();
        ex.accept(linear_chunk(t(0.5), 2.0, 0.0, 50), t(0.6), t(0.595), &state)
            .unwrap();
        // Old chunk covers up to t=0.98: overlap is 0.3*1 + 0.7*2 = 1.7; beyond it pure new = 2.0.
        let p = ex.target(t(0.8)).unwrap()[0];
        assert!((p - 1.7).abs() < 1e-9, "{p}");
        let p = ex.target(t(1.2)).unwrap()[0];
        assert!((p - 2.0).abs() < 1e-9, "{p}");
    }
}
