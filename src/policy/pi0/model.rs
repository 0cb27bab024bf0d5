//! pi0 and pi0.5: SigLIP + projector + Gemma prefix (KV cache), then flow-matching denoising
//! with the Gemma action expert attending to that cache layer by layer. Layer and tensor names
//! follow the checkpoint; the math follows lerobot's `PI0Pytorch` / `PI05Pytorch`.

pub(crate) use super::arch::prompt_len;
pub use super::arch::Variant;
pub(crate) use super::arch::{check_vocabulary, Arch, Euler, TokenError};
use super::checkpoint::{ArchOverrides, Checkpoint, CheckpointError, MappedRows};
use super::ops::{
    attention, grow, time_embedding, AttentionScratch, LayerNorm, Linear, Modulation, Norm, Probe,
    Rope,
};
use super::vecmath;
use crate::policy::rtc::{CleanPrefix, Guidance};

pub(crate) const VISION: &str = "paligemma_with_expert.paligemma.model.vision_tower.vision_model";
pub(crate) const PROJECTOR: &str =
    "paligemma_with_expert.paligemma.model.multi_modal_projector.linear";
pub(crate) const LM: &str = "paligemma_with_expert.paligemma.model.language_model";
pub(crate) const LM_HEAD: &str = "paligemma_with_expert.paligemma.lm_head.weight";
pub(crate) const EXPERT: &str = "paligemma_with_expert.gemma_expert.model";
/// Rows of the MLP computed at once (bounds its intermediate buffers; large enough that the
/// matmuls stay efficient).
const MLP_ROW_BLOCK: usize = 128;

mod batch;
mod resident;
mod steps;

struct SigLipLayer {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

struct GemmaLayer {
    input_norm: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    post_norm: Norm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

struct Gemma {
    layers: Vec<GemmaLayer>,
    norm: Norm,
}

pub struct Pi0Model {
    pub arch: Arch,
    patch_embed: Linear,
    position_embed: Vec<f32>,
    vision_layers: Vec<SigLipLayer>,
    post_ln: LayerNorm,
    projector: Linear,
    embed: MappedRows,
    lm: Gemma,
    expert: Gemma,
    state_proj: Option<Linear>,
    action_in: Linear,
    action_out: Linear,
    time_in: Linear,
    time_out: Linear,
    rope: Rope,
    min_period: f64,
    max_period: f64,
    threads: usize,
    /// The longest prompt the model takes (`prompt_len`).
    pub(crate) max_tokens: usize,
    /// A pi0.5 trained for real-time chunking (`rtc_training_max_delay`): the largest delay it
    /// takes; a leftover then conditions it as it was trained instead of guiding it.
    pub(crate) trained_rtc: Option<usize>,
}

/// The prefix's per-layer keys and values (post-RoPE) and its pad mask.
pub struct KvCache {
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
    pub(crate) pad: Vec<bool>,
}

/// One batch element's model inputs (already preprocessed).
pub struct Pi0Input<'a> {
    /// Per camera: `[3, H, W]` in [-1, 1].
    pub(crate) images: Vec<&'a [f32]>,
    pub(crate) image_masks: Vec<bool>,
    pub(crate) tokens: &'a [i64],
    pub(crate) token_masks: &'a [bool],
    /// Normalized state padded to `state_dim` (unused by pi0.5, whose state is in the prompt).
    pub state: &'a [f32],
    /// `[chunk, action_dim]` initial noise.
    pub noise: &'a [f32],
    /// Real-time chunking: pull the chunk's first steps towards the running chunk's leftover.
    pub(crate) guidance: Option<&'a Guidance>,
    /// Training-time real-time chunking: the chunk's first steps are the leftover.
    pub(crate) clean: Option<&'a CleanPrefix>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    pub(crate) prefix_ms: f64,
    pub(crate) steps_ms: f64,
}

fn load_gemma(
    ck: &Checkpoint,
    base: &str,
    a: &Arch,
    width: usize,
    mlp: usize,
    adaptive: bool,
) -> Result<Gemma, CheckpointError> {
    let norm = |name: &str| -> Result<Norm, CheckpointError> {
        // The residual stream's magnitudes, where calibration asks for them.
        let probe = Probe::of(ck, &format!("{name}.weight"));
        if adaptive {
            Ok(Norm::Adaptive(
                Linear::load(ck, &[&format!("{name}.dense")], 3 * width, width, true)?,
                probe,
            ))
        } else {
            Ok(Norm::Rms(
                ck.take(&[&format!("{name}.weight")], &[width])?
                    .data
                    .to_vec(),
                probe,
            ))
        }
    };
    let (h, kh, hd) = (a.heads, a.kv_heads, a.head_dim);
    let mut layers = Vec::new();
    for i in 0..a.layers {
        let p = format!("{base}.layers.{i}");
        let lin = |n: &str, o, inp| Linear::load(ck, &[&format!("{p}.{n}")], o, inp, false);
        layers.push(GemmaLayer {
            input_norm: norm(&format!("{p}.input_layernorm"))?,
            q: lin("self_attn.q_proj", h * hd, width)?,
            k: lin("self_attn.k_proj", kh * hd, width)?,
            v: lin("self_attn.v_proj", kh * hd, width)?,
            o: lin("self_attn.o_proj", width, h * hd)?,
            post_norm: norm(&format!("{p}.post_attention_layernorm"))?,
            gate: lin("mlp.gate_proj", mlp, width)?,
            up: lin("mlp.up_proj", mlp, width)?,
            down: lin("mlp.down_proj", width, mlp)?,
        });
    }
    Ok(Gemma {
        layers,
        norm: norm(&format!("{base}.norm"))?,
    })
}

impl Pi0Model {
    pub fn load(
        ck: &Checkpoint,
        overrides: Option<ArchOverrides>,
        threads: usize,
    ) -> Result<Pi0Model, CheckpointError> {
        let a = Arch::from_checkpoint(ck, overrides)?;
        let trained_rtc = ck
            .config
            .trained_rtc(&ck.path, a.variant == Variant::Pi05)?;
        let vw = a.vision_width;
        let pe = ck.take(
            &[&format!("{VISION}.embeddings.patch_embedding.weight")],
            &[vw, 3, a.patch, a.patch],
        )?;
        let patch_embed = Linear::new(
            pe,
            Some(
                ck.take(
                    &[&format!("{VISION}.embeddings.patch_embedding.bias")],
                    &[vw],
                )?
                .data
                .to_vec(),
            ),
            vw,
            3 * a.patch * a.patch,
        );
        let mut vision_layers = Vec::new();
        for i in 0..a.vision_layers {
            let p = format!("{VISION}.encoder.layers.{i}");
            let lin = |n: &str, o, inp| Linear::load(ck, &[&format!("{p}.{n}")], o, inp, true);
            vision_layers.push(SigLipLayer {
                ln1: LayerNorm::load(ck, &format!("{p}.layer_norm1"), vw)?,
                q: lin("self_attn.q_proj", vw, vw)?,
                k: lin("self_attn.k_proj", vw, vw)?,
                v: lin("self_attn.v_proj", vw, vw)?,
                out: lin("self_attn.out_proj", vw, vw)?,
                ln2: LayerNorm::load(ck, &format!("{p}.layer_norm2"), vw)?,
                fc1: lin("mlp.fc1", a.vision_mlp, vw)?,
                fc2: lin("mlp.fc2", vw, a.vision_mlp)?,
            });
        }
        let embed = ck.take_rows(
            &[&format!("{LM}.embed_tokens.weight"), LM_HEAD],
            a.vocab,
            a.width,
        )?;
        let ew = a.expert_width;
        let pi05 = a.variant == Variant::Pi05;
        let (time_in, time_out) = if pi05 {
            (
                Linear::load(ck, &["time_mlp_in"], ew, ew, true)?,
                Linear::load(ck, &["time_mlp_out"], ew, ew, true)?,
            )
        } else {
            (
                Linear::load(ck, &["action_time_mlp_in", "time_mlp_in"], ew, 2 * ew, true)?,
                Linear::load(ck, &["action_time_mlp_out", "time_mlp_out"], ew, ew, true)?,
            )
        };
        Ok(Pi0Model {
            patch_embed,
            position_embed: ck
                .take(
                    &[&format!("{VISION}.embeddings.position_embedding.weight")],
                    &[a.tokens_per_image(), vw],
                )?
                .data
                .to_vec(),
            vision_layers,
            post_ln: LayerNorm::load(ck, &format!("{VISION}.post_layernorm"), vw)?,
            projector: Linear::load(ck, &[PROJECTOR], a.width, vw, true)?,
            embed,
            lm: load_gemma(ck, LM, &a, a.width, a.mlp, false)?,
            expert: load_gemma(ck, EXPERT, &a, ew, a.expert_mlp, pi05)?,
            state_proj: if pi05 {
                None
            } else {
                Some(Linear::load(ck, &["state_proj"], ew, a.state_dim, true)?)
            },
            action_in: Linear::load(ck, &["action_in_proj"], ew, a.action_dim, true)?,
            action_out: Linear::load(ck, &["action_out_proj"], a.action_dim, ew, true)?,
            time_in,
            time_out,
            rope: Rope::new(a.head_dim),
            min_period: ck.config.min_period,
            max_period: ck.config.max_period,
            threads: threads.max(1),
            max_tokens: prompt_len(&ck.config, a.variant),
            trained_rtc,
            arch: a,
        })
    }

    /// One batch element's prompt (`[seq]` ids): at most `max_tokens`, every id in the
    /// vocabulary. `prefix` does not check (it clamps, so it cannot index past the table):
    /// whoever takes tokens from outside checks them here first.
    pub(crate) fn check_tokens(&self, tokens: &[i64]) -> Result<(), TokenError> {
        if tokens.len() > self.max_tokens {
            return Err(TokenError::TooMany {
                found: tokens.len(),
                max: self.max_tokens,
            });
        }
        check_vocabulary(tokens, self.arch.vocab)
    }

    /// SigLIP + projector for one `[3, S, S]` image: `[tokens, width]`.
    fn embed_image(&self, image: &[f32]) -> Vec<f32> {
        let a = &self.arch;
        let (p, side, vw) = (a.patch, a.image_size / a.patch, a.vision_width);
        let n = side * side;
        // Patches flattened as the conv weight is: channel, row, column.
        let mut patches = vec![0.0f32; n * 3 * p * p];
        for py in 0..side {
            for px in 0..side {
                let dst = &mut patches[(py * side + px) * 3 * p * p..][..3 * p * p];
                for c in 0..3 {
                    for ky in 0..p {
                        let row =
                            c * a.image_size * a.image_size + (py * p + ky) * a.image_size + px * p;
                        dst[(c * p + ky) * p..][..p].copy_from_slice(&image[row..row + p]);
                    }
                }
            }
        }
        let mut x = self.patch_embed.apply(&patches, n, self.threads);
        for (xi, pi) in x.iter_mut().zip(&self.position_embed) {
            *xi += pi;
        }
        let mut h = vec![0.0f32; n * vw];
        let mut att = vec![0.0f32; n * vw];
        let hd = vw / a.vision_heads;
        let mut scratch = AttentionScratch::default();
        for l in &self.vision_layers {
            l.ln1.forward(&x, &mut h);
            let q = l.q.apply(&h, n, self.threads);
            let k = l.k.apply(&h, n, self.threads);
            let v = l.v.apply(&h, n, self.threads);
            attention(
                &q,
                &k,
                &v,
                n,
                n,
                a.vision_heads,
                a.vision_heads,
                hd,
                &|_, _| true,
                &mut att,
                &mut scratch,
                self.threads,
            );
            let o = l.out.apply(&att, n, self.threads);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            l.ln2.forward(&x, &mut h);
            let mut m = l.fc1.apply(&h, n, self.threads);
            vecmath::gelu_in_place(&mut m);
            let o = l.fc2.apply(&m, n, self.threads);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        }
        self.post_ln.forward(&x, &mut h);
        self.projector.apply(&h, n, self.threads)
    }

    /// The prefix's embedded tokens (images, then text, `[n, width]`) and which are real.
    fn embed_prefix(&self, input: &Pi0Input) -> (Vec<f32>, Vec<bool>) {
        let a = &self.arch;
        let w = a.width;
        let tpi = a.tokens_per_image();
        let mut x = Vec::new();
        let mut pad = Vec::new();
        for (img, &mask) in input.images.iter().zip(&input.image_masks) {
            x.extend(self.embed_image(img));
            pad.extend(std::iter::repeat_n(mask, tpi));
        }
        // Text embeddings scaled by sqrt(width) in the embedding's storage type (as PyTorch).
        let dtype = self.embed.dtype;
        let scale = dtype.round((w as f64).sqrt() as f32);
        let mut row = vec![0.0f32; w];
        for (&tok, &m) in input.tokens.iter().zip(input.token_masks) {
            // Ids were checked (`check_tokens`); the clamp only keeps an unchecked one in the table.
            let id = (tok.max(0) as usize).min(a.vocab.saturating_sub(1));
            self.embed.row(id, &mut row);
            x.extend(row.iter().map(|e| dtype.round(e * scale)));
            pad.push(m);
        }
        (x, pad)
    }

    /// Positions of a prefix's tokens: the count of real tokens before each.
    fn prefix_positions(pad: &[bool]) -> Vec<i64> {
        pad.iter()
            .scan(0i64, |acc, &p| {
                *acc += p as i64;
                Some(*acc - 1)
            })
            .collect()
    }

    /// Runs the prefix (images, then text) through the language model; keeps each layer's K, V.
    pub fn prefix(&self, input: &Pi0Input) -> KvCache {
        let (x, pad) = self.embed_prefix(input);
        let positions = Self::prefix_positions(&pad);
        self.language_layers(x, pad, 1, &positions)
    }

    /// The language model over the prefix rows `x` of `batch` observations side by side
    /// (equal lengths, attending within their own); each layer's keys and values, in the
    /// same order, with `pad` as given.
    fn language_layers(
        &self,
        mut x: Vec<f32>,
        pad: Vec<bool>,
        batch: usize,
        positions: &[i64],
    ) -> KvCache {
        let n = pad.len();
        let per = n / batch.max(1);
        let seg = Segments {
            batch,
            rows: per,
            cached: 0,
            stride: per,
        };
        let allowed = |e: usize, i: usize, j: usize| pad[e * per + i] && pad[e * per + j];
        let mut cache = KvCache {
            k: Vec::new(),
            v: Vec::new(),
            pad: Vec::new(),
        };
        let kvd = self.arch.kv_heads * self.arch.head_dim;
        let mut scratch = LayerScratch::default();
        let last = self.lm.layers.len() - 1;
        for (i, layer) in self.lm.layers.iter().enumerate() {
            let mut k = vec![0.0f32; n * kvd];
            let mut v = vec![0.0f32; n * kvd];
            if i == last {
                // Only the last layer's keys and values are used (its output never is): the
                // rest of it, MLP included, is skipped. lerobot computes and drops it.
                self.kv_only(layer, &x, n, positions, (&mut k, &mut v), &mut scratch);
                cache.k.push(k);
                cache.v.push(v);
                break;
            }
            self.gemma_layer(
                layer,
                &mut x,
                n,
                positions,
                (&mut k, &mut v),
                seg,
                None,
                &allowed,
                &mut scratch,
            );
            cache.k.push(k);
            cache.v.push(v);
        }
        cache.pad = pad;
        cache
    }

    /// A decoder layer's post-RoPE keys and values of `x` (`[n, width]`), nothing else.
    fn kv_only(
        &self,
        l: &GemmaLayer,
        x: &[f32],
        n: usize,
        positions: &[i64],
        (k, v): (&mut [f32], &mut [f32]),
        s: &mut LayerScratch,
    ) {
        let width = x.len() / n;
        let normed = grow(&mut s.normed, n * width);
        l.input_norm.forward(x, normed, None);
        l.k.forward(normed, n, k, self.threads);
        l.v.forward(normed, n, v, self.threads);
        self.rope.apply(k, positions, self.arch.kv_heads);
    }

    /// One decoder layer in place on `x` (`[n, width]`: `seg.batch` observations' rows side by
    /// side). Each observation's new keys and values are written into `kv` after its cached
    /// ones (`Segments`), and its queries attend to its own keys only: `allowed(element, i,
    /// j)` in that observation's indices.
    #[allow(clippy::too_many_arguments)]
    fn gemma_layer(
        &self,
        l: &GemmaLayer,
        x: &mut [f32],
        n: usize,
        positions: &[i64],
        (k_all, v_all): (&mut [f32], &mut [f32]),
        seg: Segments,
        modulation: Option<(Modulation, Modulation)>,
        allowed: &dyn Fn(usize, usize, usize) -> bool,
        s: &mut LayerScratch,
    ) {
        let a = &self.arch;
        let width = x.len() / n;
        let (h, kh, hd) = (a.heads, a.kv_heads, a.head_dim);
        let kvd = kh * hd;
        let normed = grow(&mut s.normed, n * width);
        l.input_norm.forward(x, normed, modulation.map(|m| m.0));
        let q = grow(&mut s.q, n * h * hd);
        l.q.forward(normed, n, q, self.threads);
        let k = grow(&mut s.k, n * kvd);
        l.k.forward(normed, n, k, self.threads);
        let v = grow(&mut s.v, n * kvd);
        l.v.forward(normed, n, v, self.threads);
        self.rope.apply(q, positions, h);
        self.rope.apply(k, positions, kh);
        let rows = seg.rows;
        let t = seg.cached + rows;
        let att = grow(&mut s.att, n * h * hd);
        for e in 0..seg.batch {
            let at = (e * seg.stride + seg.cached) * kvd;
            let new = e * rows * kvd..(e + 1) * rows * kvd;
            k_all[at..at + rows * kvd].copy_from_slice(&k[new.clone()]);
            v_all[at..at + rows * kvd].copy_from_slice(&v[new]);
            let keys = e * seg.stride * kvd..(e * seg.stride + t) * kvd;
            let queries = e * rows * h * hd..(e + 1) * rows * h * hd;
            attention(
                &q[queries.clone()],
                &k_all[keys.clone()],
                &v_all[keys],
                rows,
                t,
                h,
                kh,
                hd,
                &|i, j| allowed(e, i, j),
                &mut att[queries],
                &mut s.attention,
                self.threads,
            );
        }
        let o = grow(&mut s.o, n * width);
        l.o.forward(att, n, o, self.threads);
        residual(x, o, modulation.map(|m| m.0), width);
        let normed = grow(&mut s.normed, n * width);
        l.post_norm.forward(x, normed, modulation.map(|m| m.1));
        // The MLP in blocks of rows: its intermediate (rows x mlp, twice) is the largest
        // transient buffer of the prefix; rows are independent, so the result is the same.
        let mlp = l.gate.out_dim;
        let block = MLP_ROW_BLOCK.min(n).max(1);
        let g = grow(&mut s.g, block * mlp);
        let u = grow(&mut s.u, block * mlp);
        let d = grow(&mut s.d, n * width);
        for r0 in (0..n).step_by(block) {
            let rows = block.min(n - r0);
            let input = &normed[r0 * width..(r0 + rows) * width];
            l.gate.forward(input, rows, g, self.threads);
            l.up.forward(input, rows, u, self.threads);
            vecmath::gelu_gate(&mut g[..rows * mlp], &u[..rows * mlp]);
            l.down.forward(
                &g[..rows * mlp],
                rows,
                &mut d[r0 * width..(r0 + rows) * width],
                self.threads,
            );
        }
        residual(x, d, modulation.map(|m| m.1), width);
    }

    fn time_embedding(&self, t: f32, out: &mut [f32]) {
        time_embedding(t, self.min_period, self.max_period, out);
    }

    /// As `sample_actions`, reusing `ws`: the denoising loop allocates nothing.
    pub(crate) fn sample_actions_with(
        &self,
        input: &Pi0Input,
        ws: &mut Workspace,
    ) -> (Vec<f32>, Timing) {
        let started = std::time::Instant::now();
        let cache = self.prefix(input);
        self.prepare_steps(&cache, ws);
        let prefix_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut x = input.noise.to_vec();
        let mut v = vec![0.0f32; x.len()];
        self.denoise_batch(
            &cache,
            &[input.state],
            &[input.guidance],
            &[input.clean],
            &mut x,
            &mut v,
            ws,
        );
        let total = started.elapsed().as_secs_f64() * 1e3;
        (
            x,
            Timing {
                prefix_ms,
                steps_ms: total - prefix_ms,
            },
        )
    }

    /// The Euler loop: `x` goes from noise to actions. `v` is the velocity buffer.
    pub fn denoise(
        &self,
        cache: &KvCache,
        state: &[f32],
        x: &mut [f32],
        v: &mut [f32],
        ws: &mut Workspace,
    ) {
        self.denoise_batch(cache, &[state], &[None], &[None], x, v, ws)
    }
}

/// How a layer's rows and keys divide among the observations of a batch: observation `e`'s
/// queries are rows `e * rows ..` of `x`; its keys are rows `e * stride ..` of the KV buffers,
/// `cached` already there (its prefix, for the expert), then its `rows` new ones.
#[derive(Clone, Copy, Debug)]
struct Segments {
    batch: usize,
    rows: usize,
    cached: usize,
    stride: usize,
}

/// Scratch of one decoder layer, grown to the largest size seen and then reused.
#[derive(Default)]
pub(crate) struct LayerScratch {
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    d: Vec<f32>,
    attention: AttentionScratch,
}

/// Everything the denoising steps need, sized once per observation (`prepare_steps`).
#[derive(Default)]
pub struct Workspace {
    x: Vec<f32>,
    time: Vec<f32>,
    actions: Vec<f32>,
    fused: Vec<f32>,
    m: Vec<f32>,
    /// pi0.5: the expert norms' modulation for the step's time, and for time 0 (training-time
    /// RTC's clamped tokens).
    mods: ExpertMods,
    mods0: ExpertMods,
    /// Per suffix row of the batch: a clamped token (training-time RTC).
    clean_rows: Vec<bool>,
    out: Vec<f32>,
    positions: Vec<i64>,
    /// Per expert layer: the prefix's keys and values, then room for the suffix's.
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    layer: LayerScratch,
}

/// pi0.5's condition for one flow time through every expert norm's dense layer.
#[derive(Default)]
pub(crate) struct ExpertMods {
    time: Vec<f32>,
    cond: Vec<f32>,
    cond2: Vec<f32>,
    /// Per expert layer: the input and post-attention norms' `[scale | shift | gate]`.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    /// The final norm's.
    last: Vec<f32>,
}

/// `x += y` or, with pi0.5's adaptive norms, `x += y * gate` (each row its modulation's gate).
fn residual(x: &mut [f32], y: &[f32], modulation: Option<Modulation>, width: usize) {
    match modulation {
        None => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
        Some(m) => {
            for (r, (xr, yr)) in x
                .chunks_exact_mut(width)
                .zip(y.chunks_exact(width))
                .enumerate()
            {
                let g = &m.row(r)[2 * width..3 * width];
                for i in 0..width {
                    xr[i] += yr[i] * g[i];
                }
            }
        }
    }
}
