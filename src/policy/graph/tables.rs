//! What the graphs take from the host instead of computing it: attention biases, RoPE cos/sin
//! and the flow-time embeddings. They depend only on the pad masks and the fixed step times, so
//! computing them here keeps the graphs free of cumsum, masking and trigonometry (and lets an
//! f16 graph use an f16-safe mask value).

use super::manifest::Manifest;
use crate::policy::pi0::model::Euler;
use crate::policy::pi0::ops::{time_embedding, Rope};
use crate::policy::rtc::{guidance_weight, CleanPrefix, Guidance};

/// Tables of the prefix graph, all batch elements: `bias` `[B, 1, 1, P, P]`, `cos`/`sin`
/// `[B, P, head_dim]`, and the pad mask `[B, P]` the suffix tables need.
#[derive(Clone, Debug, Default)]
pub struct PrefixTables {
    pub(crate) pad: Vec<bool>,
    pub(crate) bias: Vec<f32>,
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
}

/// Tables of the denoise graph: `bias` `[B, 1, 1, n, P + n]`, `cos`/`sin` `[B, n, head_dim]`.
#[derive(Clone, Debug, Default)]
pub struct SuffixTables {
    pub(crate) bias: Vec<f32>,
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    /// For graphs exported with `--rtc`.
    pub(crate) rtc: Option<RtcTables>,
    /// For graphs of a checkpoint trained for real-time chunking.
    pub(crate) clean: Option<CleanTables>,
}

/// Training-time real-time chunking's inputs: `rtc_clean` `[B, chunk, 1]` (1 for a token
/// clamped to the leftover) and, for unrolled graphs, `rtc_clean_values` `[B, chunk,
/// action_dim]` (the leftover there, 0 elsewhere). All zero without a leftover: plain sampling.
#[derive(Clone, Debug, Default)]
pub(crate) struct CleanTables {
    pub(crate) clean: Vec<f32>,
    pub(crate) values: Vec<f32>,
}

/// `CleanTables` for a batch: one clamped prefix per element, or none.
pub(crate) fn clean_tables(m: &Manifest, prefixes: &[CleanPrefix]) -> CleanTables {
    let per = m.chunk * m.action_dim;
    let mut t = CleanTables {
        clean: vec![0.0; m.batch * m.chunk],
        values: vec![0.0; m.batch * per],
    };
    for (e, p) in prefixes.iter().enumerate().take(m.batch) {
        t.clean[e * m.chunk..e * m.chunk + p.delay()].fill(1.0);
        p.clamp(&mut t.values[e * per..(e + 1) * per]);
    }
    t
}

/// The `--rtc` unrolled graph's guidance inputs: `rtc_target` `[B, chunk, action_dim]`,
/// `rtc_weights` `[B, chunk, 1]`, `rtc_guidance` `[steps]`. All zero without guidance: the
/// plain steps.
#[derive(Clone, Debug, Default)]
pub(crate) struct RtcTables {
    pub(crate) target: Vec<f32>,
    pub(crate) weights: Vec<f32>,
    pub(crate) guidance: Vec<f32>,
}

/// `RtcTables` for a batch: one guidance per element, or none.
pub(crate) fn rtc_tables(m: &Manifest, guidance: &[Guidance]) -> RtcTables {
    let per = m.chunk * m.action_dim;
    let mut t = RtcTables {
        target: vec![0.0; m.batch * per],
        weights: vec![0.0; m.batch * m.chunk],
        guidance: vec![0.0; m.steps],
    };
    for (e, g) in guidance.iter().enumerate().take(m.batch) {
        t.target[e * per..(e + 1) * per].copy_from_slice(g.target());
        t.weights[e * m.chunk..(e + 1) * m.chunk].copy_from_slice(g.weights());
    }
    if let Some(g) = guidance.first() {
        for (k, w) in t.guidance.iter_mut().enumerate() {
            *w = guidance_weight(1.0 - k as f64 / m.steps as f64, g.max_guidance_weight());
        }
    }
    t
}

fn rope_rows(rope: &Rope, positions: &[i64], hd: usize, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    let half = hd / 2;
    for &pos in positions {
        let start = cos.len();
        cos.resize(start + hd, 0.0);
        sin.resize(start + hd, 0.0);
        for i in 0..half {
            let (c, s) = rope.cos_sin(pos, i);
            cos[start + i] = c;
            cos[start + half + i] = c;
            sin[start + i] = s;
            sin[start + half + i] = s;
        }
    }
}

/// `image_masks[camera][b]`, `token_masks` `[B, prompt_len]`.
pub(crate) fn prefix_tables(
    m: &Manifest,
    image_masks: &[Vec<bool>],
    token_masks: &[bool],
) -> PrefixTables {
    let (b, p, l) = (m.batch, m.prefix_len, m.prompt_len);
    let rope = Rope::new(m.head_dim);
    let mut t = PrefixTables::default();
    t.bias.reserve(b * p * p);
    for e in 0..b {
        let pad: Vec<bool> = image_masks
            .iter()
            .flat_map(|cam| std::iter::repeat_n(cam[e], m.tokens_per_image))
            .chain(token_masks[e * l..(e + 1) * l].iter().copied())
            .collect();
        // Masked tokens do not advance positions (cumsum - 1).
        let positions: Vec<i64> = pad
            .iter()
            .scan(0i64, |acc, &v| {
                *acc += v as i64;
                Some(*acc - 1)
            })
            .collect();
        for i in 0..p {
            for j in 0..p {
                t.bias
                    .push(if pad[i] && pad[j] { 0.0 } else { m.mask_value });
            }
        }
        rope_rows(&rope, &positions, m.head_dim, &mut t.cos, &mut t.sin);
        t.pad.extend(pad);
    }
    t
}

/// The suffix's tables from the prefix pad mask: the state token (pi0) sees the valid prefix
/// and itself; action tokens see the valid prefix, the state token and each other.
pub(crate) fn suffix_tables(m: &Manifest, pad: &[bool]) -> SuffixTables {
    let (b, p, n) = (m.batch, m.prefix_len, m.suffix_len);
    let first_action = n - m.chunk;
    let rope = Rope::new(m.head_dim);
    let mut t = SuffixTables::default();
    for e in 0..b {
        let pad = &pad[e * p..(e + 1) * p];
        let valid = pad.iter().filter(|v| **v).count() as i64;
        for i in 0..n {
            let mask = |allowed: bool| if allowed { 0.0 } else { m.mask_value };
            t.bias.extend(pad.iter().map(|&v| mask(v)));
            t.bias
                .extend((0..n).map(|j| mask(i >= first_action || j < first_action)));
        }
        let positions: Vec<i64> = (0..n as i64).map(|i| valid + i).collect();
        rope_rows(&rope, &positions, m.head_dim, &mut t.cos, &mut t.sin);
    }
    t
}

/// Each step's time embedding for the whole batch: `[steps, B, expert_width]`, with
/// `t = 1 + k * dt` as lerobot steps it.
pub(crate) fn time_embeddings(m: &Manifest) -> Vec<f32> {
    let ew = m.expert_width;
    let euler = Euler::new(m.steps);
    let mut out = vec![0.0f32; m.steps * m.batch * ew];
    let mut row = vec![0.0f32; ew];
    for k in 0..m.steps {
        let t = euler.time(k) as f32;
        time_embedding(t, m.min_period, m.max_period, &mut row);
        for e in 0..m.batch {
            out[(k * m.batch + e) * ew..][..ew].copy_from_slice(&row);
        }
    }
    out
}
