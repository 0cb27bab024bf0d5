//! Real-time chunking (Black et al. 2025, as lerobot 0.6.1's `RTCProcessor` computes it): while
//! a chunk is denoised, its first steps are pulled towards what is still to be executed of the
//! running chunk, so the new plan agrees with the old one where the robot cannot yet switch.
//!
//! The guidance needs only each Euler step's `x` and velocity `v`: lerobot takes the
//! vector-Jacobian product through `x1 = x - t v` with `v` held fixed, so the correction equals
//! the weighted error and no backward pass through the expert is needed. Every backend that
//! exposes the per-step velocity (the CPU model, the looped graphs' host driver) applies it the
//! same way, through `Guidance::apply`.
//!
//! lerobot after 0.6.1 (PR #4056) adds training-time RTC for pi0.5: a checkpoint trained with
//! `rtc_training_max_delay` samples its chunks with the first `d` actions clamped to the
//! leftover before and after every Euler step, those tokens at flow time 0 (`CleanPrefix`);
//! no guidance, the same cost as plain sampling. Which one runs is the checkpoint's to say.

pub(crate) use crate::config::rtc::{RtcSettings, Schedule};

/// What is still to be executed of the running chunk, as one request's guidance target, in the
/// model's normalized action space: `steps` rows of `width` values (`steps` up to the chunk,
/// `width` up to the model's action width; the rest is zero-padded, as lerobot pads).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RtcPrefix {
    pub(crate) leftover: Vec<f32>,
    pub(crate) steps: usize,
    pub(crate) width: usize,
    /// Steps of the new chunk that will have run before it arrives.
    pub(crate) inference_delay: usize,
    /// Steps over which the new chunk is pulled towards the leftover.
    pub(crate) execution_horizon: usize,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum RtcError {
    #[error("the leftover has {values} values, not {steps} steps x {width}")]
    LeftoverSize {
        values: usize,
        steps: usize,
        width: usize,
    },
    #[error("the leftover has {steps} steps x {width} values; the model's chunk is {chunk} x {action_dim}")]
    LeftoverShape {
        steps: usize,
        width: usize,
        chunk: usize,
        action_dim: usize,
    },
    #[error("leftover value {index} is {value}, not a finite number")]
    NonFinite { index: usize, value: f32 },
    #[error("the inference delay is {delay} steps, more than the chunk's {chunk}")]
    Delay { delay: usize, chunk: usize },
    #[error("the guidance weight cap is {0}; it must be a positive number")]
    MaxGuidance(f32),
    #[error("the inference delay is {delay} steps, more than the {max} the model was trained to take (rtc_training_max_delay)")]
    TrainedDelay { delay: usize, max: usize },
    #[error("the inference delay is {delay} steps, more than the leftover's {steps}")]
    ShortLeftover { delay: usize, steps: usize },
}

/// Real-time chunking's conditioning of one chunk: inference-time guidance, or for a checkpoint
/// trained for it (pi0.5 with `rtc_training_max_delay`) the clamped leftover.
#[derive(Clone, Debug)]
pub enum Conditioning {
    Guided(Guidance),
    Trained(CleanPrefix),
}

impl Conditioning {
    pub(crate) fn guidance(&self) -> Option<&Guidance> {
        match self {
            Conditioning::Guided(g) => Some(g),
            Conditioning::Trained(_) => None,
        }
    }

    pub(crate) fn clean(&self) -> Option<&CleanPrefix> {
        match self {
            Conditioning::Trained(c) => Some(c),
            Conditioning::Guided(_) => None,
        }
    }
}

/// Training-time RTC's conditioning of one chunk: its first `delay` rows are the leftover (zero
/// beyond its width) at every Euler step, their tokens at flow time 0. The default conditions
/// nothing (delay 0).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CleanPrefix {
    /// `[delay, action_dim]`, in the model's normalized action space.
    values: Vec<f32>,
    delay: usize,
}

impl CleanPrefix {
    /// The first `prefix.inference_delay` rows of the leftover, checked as lerobot's
    /// `_prepare_trained_rtc_prefix` checks them: a delay of at most `max_delay` and below the
    /// chunk, a leftover that long, at most `action_dim` wide and finite. A delay of 0 conditions
    /// nothing (plain sampling, as lerobot's first chunk).
    pub(crate) fn new(
        prefix: &RtcPrefix,
        chunk: usize,
        action_dim: usize,
        max_delay: usize,
    ) -> Result<CleanPrefix, RtcError> {
        let (steps, width, delay) = (prefix.steps, prefix.width, prefix.inference_delay);
        if prefix.leftover.len() != steps * width {
            return Err(RtcError::LeftoverSize {
                values: prefix.leftover.len(),
                steps,
                width,
            });
        }
        if width > action_dim || steps > chunk {
            return Err(RtcError::LeftoverShape {
                steps,
                width,
                chunk,
                action_dim,
            });
        }
        if delay > max_delay {
            return Err(RtcError::TrainedDelay {
                delay,
                max: max_delay,
            });
        }
        if delay >= chunk {
            return Err(RtcError::Delay { delay, chunk });
        }
        if delay > steps {
            return Err(RtcError::ShortLeftover { delay, steps });
        }
        if let Some(index) = prefix.leftover.iter().position(|v| !v.is_finite()) {
            let value = prefix.leftover[index];
            return Err(RtcError::NonFinite { index, value });
        }
        let mut values = vec![0.0f32; delay * action_dim];
        for (row, src) in values
            .chunks_exact_mut(action_dim)
            .zip(prefix.leftover.chunks_exact(width.max(1)))
        {
            row[..width].copy_from_slice(src);
        }
        Ok(CleanPrefix { values, delay })
    }

    /// Steps clamped to the leftover.
    pub(crate) fn delay(&self) -> usize {
        self.delay
    }

    /// `x`'s first `delay` rows (`[chunk, action_dim]`) set to the leftover.
    pub(crate) fn clamp(&self, x: &mut [f32]) {
        x[..self.values.len()].copy_from_slice(&self.values);
    }
}

/// The per-request guidance: target `[chunk, action_dim]` and weights per step.
#[derive(Clone, Debug)]
pub struct Guidance {
    target: Vec<f32>,
    weights: Vec<f32>,
    action_dim: usize,
    max_guidance_weight: f32,
}

impl Guidance {
    /// Guidance for a model with `chunk` steps of `action_dim` values. The horizon is cut to
    /// the leftover's length, as lerobot does (nothing to agree with beyond it).
    pub(crate) fn new(
        settings: RtcSettings,
        prefix: &RtcPrefix,
        chunk: usize,
        action_dim: usize,
    ) -> Result<Guidance, RtcError> {
        let (steps, width) = (prefix.steps, prefix.width);
        if prefix.leftover.len() != steps * width {
            return Err(RtcError::LeftoverSize {
                values: prefix.leftover.len(),
                steps,
                width,
            });
        }
        if steps > chunk || width > action_dim {
            return Err(RtcError::LeftoverShape {
                steps,
                width,
                chunk,
                action_dim,
            });
        }
        if let Some(index) = prefix.leftover.iter().position(|v| !v.is_finite()) {
            let value = prefix.leftover[index];
            return Err(RtcError::NonFinite { index, value });
        }
        if prefix.inference_delay > chunk {
            return Err(RtcError::Delay {
                delay: prefix.inference_delay,
                chunk,
            });
        }
        let m = settings.max_guidance_weight;
        if !(m.is_finite() && m > 0.0) {
            return Err(RtcError::MaxGuidance(m));
        }
        let mut target = vec![0.0f32; chunk * action_dim];
        for (i, row) in prefix.leftover.chunks_exact(width.max(1)).enumerate() {
            target[i * action_dim..i * action_dim + width].copy_from_slice(row);
        }
        let horizon = prefix.execution_horizon.min(steps);
        Ok(Guidance {
            target,
            weights: prefix_weights(settings.schedule, prefix.inference_delay, horizon, chunk),
            action_dim,
            max_guidance_weight: m,
        })
    }

    /// No guidance (all weights zero), for a batch element without a leftover among guided
    /// ones.
    pub(crate) fn none(chunk: usize, action_dim: usize) -> Guidance {
        Guidance {
            target: vec![0.0; chunk * action_dim],
            weights: vec![0.0; chunk],
            action_dim,
            max_guidance_weight: 1.0,
        }
    }

    pub(crate) fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// The leftover, zero-padded to `[chunk, action_dim]`.
    pub(crate) fn target(&self) -> &[f32] {
        &self.target
    }

    pub(crate) fn max_guidance_weight(&self) -> f32 {
        self.max_guidance_weight
    }

    /// Guides one Euler step's velocity `v` at `x` and flow time `time` (1 is noise, 0 the
    /// actions): `v -= g * W (Y - (x - time v))`.
    pub(crate) fn apply(&self, x: &[f32], time: f64, v: &mut [f32]) {
        let g = guidance_weight(time, self.max_guidance_weight);
        let t = time as f32;
        for (i, &w) in self.weights.iter().enumerate() {
            if w == 0.0 {
                continue;
            }
            let r = i * self.action_dim..(i + 1) * self.action_dim;
            for ((v, &x), &y) in v[r.clone()]
                .iter_mut()
                .zip(&x[r.clone()])
                .zip(&self.target[r])
            {
                let err = w * (y - (x - t * *v));
                *v -= g * err;
            }
        }
    }
}

/// lerobot's guidance weight at flow time `time` (its `tau = 1 - time`):
/// `min(beta, (1 - tau) / tau * ((1 - tau)^2 + tau^2) / (1 - tau)^2)`, `beta` where that is
/// infinite (the first step).
pub(crate) fn guidance_weight(time: f64, max_guidance_weight: f32) -> f32 {
    let beta = max_guidance_weight;
    let tau = (1.0 - time) as f32;
    let one_minus = 1.0 - tau;
    let inv_r2 = (one_minus * one_minus + tau * tau) / (one_minus * one_minus);
    let c = one_minus / tau;
    let c = if c == f32::INFINITY { beta } else { c };
    let g = c * inv_r2;
    let g = if g == f32::INFINITY { beta } else { g };
    g.min(beta)
}

/// Per-step prefix weights over `total` steps (lerobot's `get_prefix_weights(start, end,
/// total)`); `start` is cut to `end`.
pub(crate) fn prefix_weights(
    schedule: Schedule,
    start: usize,
    end: usize,
    total: usize,
) -> Vec<f32> {
    let start = start.min(end);
    let mut w = vec![0.0f32; total];
    match schedule {
        Schedule::Zeros => w.iter_mut().take(start).for_each(|x| *x = 1.0),
        Schedule::Ones => w.iter_mut().take(end).for_each(|x| *x = 1.0),
        Schedule::Linear | Schedule::Exp => {
            w.iter_mut().take(start).for_each(|x| *x = 1.0);
            // linspace(1, 0, n + 2)[1:-1] over the steps from `start` to `end`.
            let n = end.min(total).saturating_sub(start);
            for k in 0..n {
                let lin = 1.0 - (k + 1) as f64 / (n + 1) as f64;
                w[start + k] = if schedule == Schedule::Exp {
                    (lin * lin.exp_m1() / (std::f64::consts::E - 1.0)) as f32
                } else {
                    lin as f32
                };
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_weights_follow_each_schedule() {
        assert_eq!(
            prefix_weights(Schedule::Zeros, 2, 5, 8),
            [1., 1., 0., 0., 0., 0., 0., 0.]
        );
        assert_eq!(
            prefix_weights(Schedule::Ones, 2, 5, 8),
            [1., 1., 1., 1., 1., 0., 0., 0.]
        );
        let lin = prefix_weights(Schedule::Linear, 2, 5, 8);
        let want = [1., 1., 0.75, 0.5, 0.25, 0., 0., 0.];
        assert!(
            lin.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-7),
            "{lin:?}"
        );
        let exp = prefix_weights(Schedule::Exp, 2, 5, 8);
        let e = |w: f32| w * (w.exp() - 1.0) / (std::f32::consts::E - 1.0);
        let want = [1., 1., e(0.75), e(0.5), e(0.25), 0., 0., 0.];
        assert!(
            exp.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{exp:?}"
        );
        // The delay is cut to the horizon; a horizon past the chunk ramps to its end.
        assert_eq!(
            prefix_weights(Schedule::Zeros, 9, 4, 6),
            [1., 1., 1., 1., 0., 0.]
        );
        let long = prefix_weights(Schedule::Linear, 1, 20, 4);
        assert!((long[3] - 0.25).abs() < 1e-7 && long[0] == 1.0, "{long:?}");
    }

    #[test]
    fn guidance_weight_is_capped_and_infinite_at_the_first_step() {
        assert_eq!(guidance_weight(1.0, 10.0), 10.0);
        // time 0.2: tau 0.8, c = 0.25, inv_r2 = (0.04 + 0.64) / 0.04 = 17.
        assert!((guidance_weight(0.2, 10.0) - 4.25).abs() < 1e-5);
        assert_eq!(guidance_weight(0.2, 2.0), 2.0);
    }

    #[test]
    fn apply_moves_the_prefix_towards_the_leftover_and_leaves_the_rest() {
        let prefix = RtcPrefix {
            leftover: vec![1.0, 2.0, 3.0, 4.0],
            steps: 2,
            width: 2,
            inference_delay: 1,
            execution_horizon: 2,
        };
        let settings = RtcSettings {
            schedule: Schedule::Zeros,
            max_guidance_weight: 10.0,
        };
        let g = Guidance::new(settings, &prefix, 3, 3).unwrap();
        let x = vec![0.5f32; 9];
        let mut v = vec![0.1f32; 9];
        g.apply(&x, 0.2, &mut v);
        // Step 0 guided: x1 = 0.5 - 0.2 * 0.1 = 0.48; v = 0.1 - 4.25 * (y - 0.48).
        let want = |y: f32| 0.1 - 4.25 * (y - 0.48);
        assert!((v[0] - want(1.0)).abs() < 1e-5 && (v[1] - want(2.0)).abs() < 1e-5);
        // The padded column is pulled towards 0, as lerobot's zero padding does.
        assert!((v[2] - want(0.0)).abs() < 1e-5);
        assert!(v[3..].iter().all(|&x| x == 0.1), "{v:?}");
    }

    #[test]
    fn bad_prefixes_are_refused_with_the_reason() {
        let ok = RtcPrefix {
            leftover: vec![0.0; 6],
            steps: 3,
            width: 2,
            inference_delay: 1,
            execution_horizon: 3,
        };
        let s = RtcSettings::default();
        assert!(Guidance::new(s, &ok, 4, 2).is_ok());
        let e = Guidance::new(s, &ok, 2, 2).unwrap_err();
        assert!(matches!(e, RtcError::LeftoverShape { .. }), "{e}");
        let mut nan = ok.clone();
        nan.leftover[4] = f32::NAN;
        let e = Guidance::new(s, &nan, 4, 2).unwrap_err();
        assert!(e.to_string().contains("leftover value 4 is NaN"), "{e}");
        let mut late = ok.clone();
        late.inference_delay = 5;
        assert!(matches!(
            Guidance::new(s, &late, 4, 2),
            Err(RtcError::Delay { .. })
        ));
        let bad = RtcSettings {
            max_guidance_weight: 0.0,
            ..s
        };
        assert!(matches!(
            Guidance::new(bad, &ok, 4, 2),
            Err(RtcError::MaxGuidance(_))
        ));
        let short = RtcPrefix {
            leftover: vec![0.0; 5],
            ..ok
        };
        assert!(matches!(
            Guidance::new(s, &short, 4, 2),
            Err(RtcError::LeftoverSize { .. })
        ));
    }
}
