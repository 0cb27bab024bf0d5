//! The memory the loaded model's weights take (what `pi0d check` compares with the machine's).

use super::{Gemma, Pi0Model};
use crate::policy::pi0::ops::{LayerNorm, Linear, Norm};

fn floats(v: &[f32]) -> u64 {
    v.len() as u64 * 4
}

fn linear(l: &Linear) -> u64 {
    l.w.bytes() as u64
        + l.b.as_deref().map_or(0, floats)
        + l.input_scale.as_deref().map_or(0, floats)
}

fn layer_norm(n: &LayerNorm) -> u64 {
    floats(&n.w) + floats(&n.b)
}

fn norm(n: &Norm) -> u64 {
    match n {
        Norm::Rms(w, _) => floats(w),
        Norm::Adaptive(l, _) => linear(l),
    }
}

fn gemma(g: &Gemma) -> u64 {
    let layers: u64 = g
        .layers
        .iter()
        .map(|l| {
            [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                .into_iter()
                .map(linear)
                .sum::<u64>()
                + norm(&l.input_norm)
                + norm(&l.post_norm)
        })
        .sum();
    layers + norm(&g.norm)
}

impl Pi0Model {
    /// Bytes of weights held in memory once loaded: the packed linear layers (in the width the
    /// checkpoint stores them: f32, bf16, int8 or int4 with their scales), norms and biases.
    /// The text embedding is read from the mapped file a row at a time and is not counted.
    pub(crate) fn weight_bytes(&self) -> u64 {
        let vision: u64 = self
            .vision_layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.out, &l.fc1, &l.fc2]
                    .into_iter()
                    .map(linear)
                    .sum::<u64>()
                    + layer_norm(&l.ln1)
                    + layer_norm(&l.ln2)
            })
            .sum();
        let heads: u64 = [
            &self.action_in,
            &self.action_out,
            &self.time_in,
            &self.time_out,
        ]
        .into_iter()
        .chain(self.state_proj.as_ref())
        .map(linear)
        .sum();
        linear(&self.patch_embed)
            + floats(&self.position_embed)
            + vision
            + layer_norm(&self.post_ln)
            + linear(&self.projector)
            + gemma(&self.lm)
            + gemma(&self.expert)
            + heads
    }
}
