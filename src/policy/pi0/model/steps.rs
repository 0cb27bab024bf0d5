//! The denoising steps: the workspace sized once per observation, and one step of the action
//! expert over the cached prefix (pi0's state and time-fused action tokens, or pi0.5's action
//! tokens with the time through every adaptive norm, per token for training-time real-time
//! chunking's clamped steps).

use super::{vecmath, ExpertMods, KvCache, Pi0Model, Segments, Workspace};
use crate::policy::pi0::ops::{grow, Modulation};

impl Pi0Model {
    /// Sizes `ws` for the steps from `cache`, and copies each layer's cached keys and values in
    /// front of the room for the suffix's: done once per observation, not per step.
    pub fn prepare_steps(&self, cache: &KvCache, ws: &mut Workspace) {
        self.prepare_batch_steps(cache, 1, ws)
    }

    /// As `prepare_steps` for `batch` observations whose prefixes lie side by side in `cache`
    /// (equal lengths); their suffixes follow them in the same order.
    pub(crate) fn prepare_batch_steps(&self, cache: &KvCache, batch: usize, ws: &mut Workspace) {
        let a = &self.arch;
        let kvd = a.kv_heads * a.head_dim;
        let n = self.suffix_len();
        let per = cache.pad.len() / batch.max(1);
        let stride = per + n;
        // Per observation: its prefix's keys and values, then room for its suffix's.
        ws.kv.resize_with(a.layers, Default::default);
        for (i, (k, v)) in ws.kv.iter_mut().enumerate() {
            let (k, v) = (grow(k, batch * stride * kvd), grow(v, batch * stride * kvd));
            for e in 0..batch {
                let (src, dst) = (e * per * kvd, e * stride * kvd);
                k[dst..dst + per * kvd].copy_from_slice(&cache.k[i][src..src + per * kvd]);
                v[dst..dst + per * kvd].copy_from_slice(&cache.v[i][src..src + per * kvd]);
            }
        }
        ws.mods.layers.resize_with(a.layers, Default::default);
        ws.mods0.layers.resize_with(a.layers, Default::default);
        ws.positions.clear();
        for e in 0..batch {
            let valid = cache.pad[e * per..(e + 1) * per]
                .iter()
                .filter(|p| **p)
                .count() as i64;
            ws.positions.extend((0..n as i64).map(|i| valid + i));
        }
    }

    /// Suffix tokens of a step: pi0's state token and the action tokens, or pi0.5's actions.
    fn suffix_len(&self) -> usize {
        self.arch.chunk + usize::from(self.state_proj.is_some())
    }

    /// The velocity field at `x_t` (`[chunk, action_dim]`) and time `t`, into `velocity`.
    /// Allocates nothing once `ws` has been prepared for `cache`.
    pub fn denoise_step(
        &self,
        cache: &KvCache,
        state: &[f32],
        x_t: &[f32],
        t: f32,
        ws: &mut Workspace,
        velocity: &mut [f32],
    ) {
        self.denoise_batch_step(cache, &[state], x_t, t, &[], ws, velocity)
    }

    /// pi0.5's condition for flow time `t` (`silu(time_mlp_out(silu(time_mlp_in(emb(t)))))`)
    /// through every expert norm's dense layer, into `m`.
    fn expert_modulation(&self, t: f32, m: &mut ExpertMods) {
        let ew = self.arch.expert_width;
        let threads = self.threads;
        let time = grow(&mut m.time, ew);
        self.time_embedding(t, time);
        let c2 = grow(&mut m.cond2, ew);
        self.time_in.forward(time, 1, c2, threads);
        vecmath::silu_in_place(c2);
        let c = grow(&mut m.cond, ew);
        self.time_out.forward(c2, 1, c, threads);
        vecmath::silu_in_place(c);
        for (l, (mi, mp)) in self.expert.layers.iter().zip(m.layers.iter_mut()) {
            if let (Some(di), Some(dp)) = (l.input_norm.dense(), l.post_norm.dense()) {
                di.forward(c, 1, grow(mi, 3 * ew), threads);
                dp.forward(c, 1, grow(mp, 3 * ew), threads);
            }
        }
        if let Some(d) = self.expert.norm.dense() {
            d.forward(c, 1, grow(&mut m.last, 3 * ew), threads);
        }
    }

    /// `denoise_step` for a batch side by side (`prepare_batch_steps`): one state per
    /// observation, `x_t` and `velocity` `[batch, chunk, action_dim]`. Every row of every
    /// layer's products is one observation's; attention keeps each to its own prefix and
    /// suffix, so each element gets what it gets alone.
    ///
    /// `clean`, per observation (empty: none): training-time RTC's clamped steps, whose tokens
    /// run at flow time 0 (pi0.5's per-token condition).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn denoise_batch_step(
        &self,
        cache: &KvCache,
        states: &[&[f32]],
        x_t: &[f32],
        t: f32,
        clean: &[usize],
        ws: &mut Workspace,
        velocity: &mut [f32],
    ) {
        let a = &self.arch;
        let ew = a.expert_width;
        let chunk = a.chunk;
        let n = self.suffix_len();
        let threads = self.threads;
        let batch = states.len();
        let Workspace {
            x,
            time,
            actions,
            fused,
            m,
            mods,
            mods0,
            clean_rows,
            out,
            positions,
            kv,
            layer,
        } = ws;
        let actions = grow(actions, batch * chunk * ew);
        self.action_in.forward(x_t, batch * chunk, actions, threads);
        let x = grow(x, batch * n * ew);
        let conditioned = match &self.state_proj {
            Some(sp) => {
                // pi0: [state token | action tokens fused with time], per observation (lerobot
                // trains no pi0 for training-time RTC: the pipeline refuses one).
                debug_assert!(clean.iter().all(|d| *d == 0));
                let time = grow(time, ew);
                self.time_embedding(t, time);
                let fused = grow(fused, batch * chunk * 2 * ew);
                for (i, row) in fused.chunks_exact_mut(2 * ew).enumerate() {
                    row[..ew].copy_from_slice(&actions[i * ew..(i + 1) * ew]);
                    row[ew..].copy_from_slice(time);
                }
                let m = grow(m, batch * chunk * ew);
                self.time_in.forward(fused, batch * chunk, m, threads);
                vecmath::silu_in_place(m);
                for (e, state) in states.iter().enumerate() {
                    let xe = &mut x[e * n * ew..(e + 1) * n * ew];
                    sp.forward(&state[..a.state_dim], 1, &mut xe[..ew], threads);
                    let me = &m[e * chunk * ew..(e + 1) * chunk * ew];
                    self.time_out.forward(me, chunk, &mut xe[ew..], threads);
                }
                false
            }
            None => {
                // pi0.5: action tokens only; time conditions every expert norm, per token
                // where training-time RTC clamps some to time 0.
                x.copy_from_slice(actions);
                self.expert_modulation(t, mods);
                if clean.iter().any(|d| *d > 0) {
                    self.expert_modulation(0.0, mods0);
                }
                true
            }
        };
        clean_rows.clear();
        if clean.iter().any(|d| *d > 0) {
            for e in 0..batch {
                let d = clean.get(e).copied().unwrap_or(0);
                clean_rows.extend((0..n).map(|i| i < d));
            }
        }
        fn modulation<'m>(
            a: &'m [f32],
            z: &'m [f32],
            rows: &'m [bool],
            w: usize,
        ) -> Modulation<'m> {
            Modulation::per_row(&a[..w], &z[..w.min(z.len())], rows)
        }
        let per = cache.pad.len() / batch.max(1);
        let seg = Segments {
            batch,
            rows: n,
            cached: per,
            stride: per + n,
        };
        // Block attention: the state token sees its prefix and itself; action tokens see all
        // of their observation's.
        let first_action = n - chunk;
        let pad = &cache.pad;
        let allowed = |e: usize, i: usize, j: usize| {
            if j < per {
                pad[e * per + j]
            } else {
                let jj = j - per;
                i >= first_action || jj < first_action
            }
        };
        for (i, l) in self.expert.layers.iter().enumerate() {
            let m = conditioned.then(|| {
                let (t, z) = (&mods.layers[i], &mods0.layers[i]);
                let rows = clean_rows.as_slice();
                (
                    modulation(&t.0, &z.0, rows, 3 * ew),
                    modulation(&t.1, &z.1, rows, 3 * ew),
                )
            });
            let (k, v) = &mut kv[i];
            self.gemma_layer(l, x, batch * n, positions, (k, v), seg, m, &allowed, layer);
        }
        let out = grow(out, batch * n * ew);
        self.expert.norm.forward(
            x,
            out,
            conditioned.then(|| modulation(&mods.last, &mods0.last, clean_rows, 3 * ew)),
        );
        let ad = a.action_dim;
        for e in 0..batch {
            let rows = &out[(e * n + n - chunk) * ew..(e + 1) * n * ew];
            let v = &mut velocity[e * chunk * ad..(e + 1) * chunk * ad];
            self.action_out.forward(rows, chunk, v, threads);
        }
    }
}
