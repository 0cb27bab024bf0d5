//! Executes joint-space chunks against the monotonic clock.
//!
//! Step `i` of a chunk is due at `obs_stamp + i * period`, so the steps that passed while the
//! policy was thinking are skipped by construction. A new chunk takes over from the current
//! commanded state through a quintic correction that starts at the commanded position, velocity
//! and acceleration and fades to zero (with zero velocity and acceleration) over the blend window:
//! the commanded trajectory stays C2 across every switch.

use super::interpolate::{quintic_basis, sample};
use crate::chunk::JointChunk;
use crate::config::{Interpolation, MergeMode};
use crate::joints::{JointVector, MotionState};
use crate::time::MonoTime;

/// Why a chunk was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkRejection {
    /// Too few steps left in the future to execute.
    Stale,
    /// Computed from an older observation than the chunk being executed.
    OutOfOrder,
}

/// The correction added to a new chunk after a switch. Its position part fades over
/// `position_window_s` (long enough for every joint's limits), its velocity and acceleration
/// parts over the configured `motion_window_s`: each quintic basis meets its own boundary
/// conditions, so the sum starts exactly at the commanded state and is C2 throughout.
#[derive(Clone, Copy, Debug)]
struct Blend {
    start: MonoTime,
    position_window_s: f64,
    motion_window_s: f64,
    /// Commanded minus new-chunk position, velocity and acceleration at `start`.
    offset: MotionState,
}

pub struct Executor {
    interpolation: Interpolation,
    merge: MergeMode,
    blend_window_s: f64,
    min_window_s: f64,
    /// Per-joint velocity and acceleration limits the blend must stay within (empty: none).
    velocity_limit: JointVector,
    acceleration_limit: JointVector,
    active: Option<Box<JointChunk>>,
    blend: Option<Blend>,
    scratch: JointVector,
    last_correction: f64,
}

/// Finite-difference step for the new chunk's derivatives at the switch time.
const DERIVATIVE_STEP_S: f64 = 1e-3;
/// Peak |H0'| and |H0''| of the quintic fade `1 - 10u³ + 15u⁴ - 6u⁵` on u in [0, 1].
const QUINTIC_PEAK_VELOCITY: f64 = 1.875;
const QUINTIC_PEAK_ACCELERATION: f64 = 5.774;

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
            velocity_limit: JointVector::zeros(0),
            acceleration_limit: JointVector::zeros(0),
            active: None,
            blend: None,
            scratch: JointVector::zeros(0),
            last_correction: 0.0,
        }
    }

    /// Blends are stretched so that the correction alone needs at most half of these limits.
    pub(crate) fn set_limits(&mut self, velocity: &JointVector, acceleration: &JointVector) {
        self.velocity_limit = *velocity;
        self.acceleration_limit = *acceleration;
    }

    /// The shortest window over which fading a position offset keeps its peak velocity
    /// (1.875 e / W) and acceleration (5.77 e / W²) within half of each joint's limits. Only the
    /// position fade is stretched: its excursion is bounded by the offset itself, whereas a
    /// velocity offset faded over a longer window travels further (0.195 e W).
    fn feasible_window(&self, offset: &JointVector) -> f64 {
        let mut w: f64 = 0.0;
        for j in 0..offset.len().min(self.velocity_limit.len()) {
            let e = offset[j].abs();
            let (v, a) = (
                0.5 * self.velocity_limit[j],
                0.5 * self.acceleration_limit[j],
            );
            if v > 0.0 && a > 0.0 {
                w = w
                    .max(QUINTIC_PEAK_VELOCITY * e / v)
                    .max((QUINTIC_PEAK_ACCELERATION * e / a).sqrt());
            }
        }
        w
    }

    /// The largest joint distance the blend of the latest accepted chunk bridges.
    pub(crate) fn last_correction(&self) -> f64 {
        self.last_correction
    }

    pub(crate) fn active_seq(&self) -> Option<u64> {
        self.active.as_ref().map(|c| c.seq)
    }

    /// Seconds of chunk left after `now` (0 when none).
    pub(crate) fn remaining_s(&self, now: MonoTime) -> f64 {
        self.active
            .as_ref()
            .map_or(0.0, |c| c.end().seconds_since(now).max(0.0))
    }

    /// Drops the active chunk (hold, e-stop); returns it for recycling.
    pub(crate) fn clear(&mut self) -> Option<Box<JointChunk>> {
        self.blend = None;
        self.active.take()
    }

    /// Takes over `chunk` at the tick following `last_tick`, where the commanded state was
    /// `commanded`. Returns the chunk it replaces (for recycling), or gives `chunk` back with the
    /// reason it was refused.
    #[allow(clippy::type_complexity)]
    pub(crate) fn accept(
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
                self.average_overlap(&mut chunk, active, old_weight);
            }
        }
        let window_s = match self.merge {
            MergeMode::LatestOnly => self.min_window_s,
            _ => self.blend_window_s,
        };
        // The new chunk's position, velocity and acceleration where the commanded state stands.
        // Central differences, or forward ones at the chunk's very start (it is not defined
        // before its observation: sampling there would clamp and fake a huge acceleration).
        let ts = last_tick.seconds_since(chunk.obs_stamp).max(0.0);
        let mode = self.interpolation;
        let d = DERIVATIVE_STEP_S;
        let centre = ts >= d;
        let mut f0 = JointVector::zeros(0);
        let mut f1 = JointVector::zeros(0);
        let mut f2 = JointVector::zeros(0);
        sample(&chunk, mode, ts, &mut f0);
        sample(&chunk, mode, if centre { ts - d } else { ts + d }, &mut f1);
        sample(
            &chunk,
            mode,
            if centre { ts + d } else { ts + 2.0 * d },
            &mut f2,
        );
        let mut offset = *commanded;
        for j in 0..f0.len() {
            let (vel, acc) = if centre {
                (
                    (f2[j] - f1[j]) / (2.0 * d),
                    (f2[j] - 2.0 * f0[j] + f1[j]) / (d * d),
                )
            } else {
                (
                    (-3.0 * f0[j] + 4.0 * f1[j] - f2[j]) / (2.0 * d),
                    (f0[j] - 2.0 * f1[j] + f2[j]) / (d * d),
                )
            };
            offset.position[j] = commanded.position[j] - f0[j];
            offset.velocity[j] = commanded.velocity[j] - vel;
            offset.acceleration[j] = commanded.acceleration[j] - acc;
        }
        self.last_correction = offset.position.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        // Never faster than the joints allow: a short window on a slow joint (a gripper) would
        // otherwise ask the governor for more than it may give.
        self.blend = Some(Blend {
            start: last_tick,
            position_window_s: window_s.max(self.feasible_window(&offset.position)),
            motion_window_s: window_s,
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
    pub(crate) fn target(&mut self, now: MonoTime) -> Option<&JointVector> {
        let chunk = self.active.as_ref()?;
        if now > chunk.end() {
            return None;
        }
        let t = now.seconds_since(chunk.obs_stamp);
        sample(chunk, self.interpolation, t, &mut self.scratch);
        if let Some(b) = &self.blend {
            let s = now.seconds_since(b.start).max(0.0);
            let (wp, wm) = (b.position_window_s, b.motion_window_s);
            if s >= wp && s >= wm {
                self.blend = None;
            } else {
                let bp = quintic_basis((s / wp).min(1.0));
                let bm = quintic_basis((s / wm).min(1.0));
                for j in 0..self.scratch.len() {
                    self.scratch[j] += bp[0] * b.offset.position[j]
                        + bm[1] * wm * b.offset.velocity[j]
                        + bm[2] * wm * wm * b.offset.acceleration[j];
                }
            }
        }
        Some(&self.scratch)
    }
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
    fn when_offset_is_large_for_a_slow_joint_expect_blend_stretched_within_limits() {
        let mut ex = Executor::new(Interpolation::Quintic, MergeMode::Blend, 0.1, 0.005);
        ex.set_limits(
            &JointVector::from_slice(&[0.1]),
            &JointVector::from_slice(&[0.5]),
        );
        let state = MotionState::at_rest(JointVector::from_slice(&[0.016]));
        ex.accept(linear_chunk(t(0.0), 0.0, 0.0, 50), t(0.1), t(0.095), &state)
            .unwrap();
        // Sample the blended target; its velocity and acceleration stay within half the limits.
        let dt = 0.005;
        let p: Vec<f64> = (0..200)
            .map(|k| ex.target(t(0.095 + k as f64 * dt)).map_or(0.0, |v| v[0]))
            .collect();
        for k in 2..p.len() {
            let v = (p[k] - p[k - 1]) / dt;
            let a = (p[k] - 2.0 * p[k - 1] + p[k - 2]) / (dt * dt);
            assert!(
                v.abs() <= 0.05 * 1.01 && a.abs() <= 0.25 * 1.05,
                "tick {k}: v {v} a {a}"
            );
        }
    }

    #[test]
    fn when_chunk_starts_at_the_switch_expect_its_derivatives_not_clamped() {
        // A chunk accelerating uniformly from its first step, switched to exactly at its start:
        // the blend must see its true velocity and acceleration (no offset to fade).
        let mut ex = Executor::new(Interpolation::Quintic, MergeMode::Blend, 0.1, 0.005);
        let mut c = JointChunk::with_capacity(50);
        c.obs_stamp = t(0.0);
        c.period_s = 0.02;
        for i in 0..50 {
            let x = i as f64 * 0.02;
            c.positions.push(JointVector::from_slice(&[0.5 * x * x]));
        }
        c.update_derivatives();
        let state = MotionState {
            position: JointVector::from_slice(&[0.0]),
            velocity: JointVector::from_slice(&[0.0]),
            acceleration: JointVector::from_slice(&[1.0]),
        };
        ex.accept(Box::new(c), t(0.005), t(0.0), &state).unwrap();
        for k in 1..40 {
            let s = k as f64 * 0.005;
            let p = ex.target(t(s)).unwrap()[0];
            assert!((p - 0.5 * s * s).abs() < 1e-4, "t={s}: {p}");
        }
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
