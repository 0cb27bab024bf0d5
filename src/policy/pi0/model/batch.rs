//! Several observations through the model at once (`pi0d serve` gathers concurrent
//! requests): every layer's products run over all of their rows, so the weights are read once
//! for the batch, while attention stays within each observation.

use super::{Euler, KvCache, Pi0Input, Pi0Model, Timing, Workspace};
use crate::policy::rtc::{CleanPrefix, Guidance};

impl Pi0Model {
    /// `denoise` for observations side by side (`prepare_batch_steps`), each with its own
    /// real-time-chunking guidance or none.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn denoise_batch(
        &self,
        cache: &KvCache,
        states: &[&[f32]],
        guidance: &[Option<&Guidance>],
        clean: &[Option<&CleanPrefix>],
        x: &mut [f32],
        v: &mut [f32],
        ws: &mut Workspace,
    ) {
        let euler = Euler::new(self.arch.steps);
        let per = x.len() / states.len().max(1);
        // Training-time RTC: the clamped steps are the leftover before and after every step,
        // their tokens at time 0 (lerobot's `euler_integrate` with a hard prefix).
        // (Built only when conditioned: plain denoising allocates nothing.)
        let delays: Vec<usize> = if clean.iter().any(Option::is_some) {
            clean.iter().map(|c| c.map_or(0, |c| c.delay())).collect()
        } else {
            Vec::new()
        };
        let clamp = |x: &mut [f32]| {
            for (e, c) in clean.iter().enumerate() {
                if let Some(c) = c {
                    c.clamp(&mut x[e * per..(e + 1) * per]);
                }
            }
        };
        for step in 0..self.arch.steps {
            let time = euler.time(step);
            clamp(x);
            self.denoise_batch_step(cache, states, x, time as f32, &delays, ws, v);
            for (e, g) in guidance.iter().enumerate() {
                if let Some(g) = g {
                    let r = e * per..(e + 1) * per;
                    g.apply(&x[r.clone()], time, &mut v[r]);
                }
            }
            euler.advance(x, v);
            clamp(x);
        }
    }

    /// Full inference for several observations at once: the language model and the expert
    /// run each layer's products over all of their rows (attention kept per observation), so
    /// the weights are read once for all. Actions `[batch, chunk, action_dim]`, each as
    /// `sample_actions` gives it alone (to rounding). Prefixes of different lengths run one
    /// after another.
    pub(crate) fn sample_actions_batch(
        &self,
        inputs: &[Pi0Input],
        ws: &mut Workspace,
    ) -> (Vec<f32>, Timing) {
        let started = std::time::Instant::now();
        let embedded: Vec<(Vec<f32>, Vec<bool>)> =
            inputs.iter().map(|i| self.embed_prefix(i)).collect();
        let per = embedded.first().map_or(0, |e| e.1.len());
        if inputs.len() < 2 || embedded.iter().any(|e| e.1.len() != per) {
            let mut out = Vec::new();
            let mut t = Timing::default();
            for input in inputs {
                let (a, ti) = self.sample_actions_with(input, ws);
                out.extend(a);
                t.prefix_ms += ti.prefix_ms;
                t.steps_ms += ti.steps_ms;
            }
            return (out, t);
        }
        let mut x = Vec::with_capacity(per * inputs.len() * self.arch.width);
        let mut pad = Vec::with_capacity(per * inputs.len());
        let mut positions = Vec::with_capacity(per * inputs.len());
        for (xe, pe) in embedded {
            positions.extend(Self::prefix_positions(&pe));
            x.extend(xe);
            pad.extend(pe);
        }
        let cache = self.language_layers(x, pad, inputs.len(), &positions);
        self.prepare_batch_steps(&cache, inputs.len(), ws);
        let prefix_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut x: Vec<f32> = inputs
            .iter()
            .flat_map(|i| i.noise.iter().copied())
            .collect();
        let mut v = vec![0.0f32; x.len()];
        let states: Vec<&[f32]> = inputs.iter().map(|i| i.state).collect();
        let guidance: Vec<Option<&Guidance>> = inputs.iter().map(|i| i.guidance).collect();
        let clean: Vec<Option<&CleanPrefix>> = inputs.iter().map(|i| i.clean).collect();
        self.denoise_batch(&cache, &states, &guidance, &clean, &mut x, &mut v, ws);
        let total = started.elapsed().as_secs_f64() * 1e3;
        (
            x,
            Timing {
                prefix_ms,
                steps_ms: total - prefix_ms,
            },
        )
    }
}
