//! pi0 / pi0.5 as two static ONNX graphs, built from the checkpoint's tensors:
//!
//! - `prefix`: images, prompt tokens, and host-made tables (attention bias, RoPE cos/sin) ->
//!   the KV cache `[layers, 2, batch, prefix_len, kv_heads*head_dim]`.
//! - `denoise`: the KV cache, state, `x_t`, the step's time embedding and the suffix tables ->
//!   `x_{t+dt}` (one Euler step, looped on the host), or with `unroll` all steps -> actions.
//!
//! Fusions (portable ONNX, opset 13): one QKV matmul per attention, one gate/up matmul per MLP,
//! weights pre-transposed to `[in, out]`, RMSNorm's `1 + w` folded, the text embedding pre-scaled
//! by `sqrt(width)`, pi0's time half of `action_time_mlp_in` applied once per step instead of per
//! action token, the last language layer reduced to what its KV needs, and everything that
//! depends only on the pad masks or the fixed step times computed on the host. Norm statistics
//! and softmax run in f32 whatever the compute type.

use super::builder::{attr_int, attr_ints, F32Source, GraphBuilder, ProbeKind};
use super::proto::data_type;
use super::ExportError;
use crate::policy::pi0::checkpoint::Checkpoint;
use crate::policy::pi0::hadamard;
use crate::policy::pi0::model::{Arch, Variant, EXPERT, LM, LM_HEAD, PROJECTOR, VISION};
use crate::policy::pi0::ops::RMS_EPS;
use crate::policy::pi0::quant::calibrate::group_of;
use crate::policy::pi0::quant::load::INPUT_SCALE;
use crate::policy::pi0::quant::{Group, Scheme};
use qlinear::Form;

/// How weights are stored and activations computed in the exported graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportDtype {
    /// f32 weights and compute.
    F32,
    /// f16 weights and compute (Ascend 310-series, TensorRT fp16); norms and softmax in f32.
    F16,
    /// bf16 weights, widened to f32 for compute (half the file size of f32).
    Bf16,
}

impl ExportDtype {
    pub(crate) fn storage(self) -> i32 {
        match self {
            ExportDtype::F32 => data_type::FLOAT,
            ExportDtype::F16 => data_type::FLOAT16,
            ExportDtype::Bf16 => data_type::BFLOAT16,
        }
    }

    pub(crate) fn compute(self) -> i32 {
        match self {
            ExportDtype::F16 => data_type::FLOAT16,
            _ => data_type::FLOAT,
        }
    }

    /// The additive attention-mask value fed in the bias tables: lerobot's for f32 compute, and
    /// for f16 one that stays finite in f16 even with a score added (a `-inf` row would turn a
    /// fully masked softmax into NaN on runtimes that compute it in f16).
    pub(crate) fn mask_value(self) -> f32 {
        match self {
            ExportDtype::F16 => -30000.0,
            _ => crate::policy::pi0::ops::MASK_VALUE,
        }
    }
}

/// Static sizes the graphs are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GraphSizes {
    pub(crate) batch: usize,
    pub(crate) cameras: usize,
    pub(crate) prompt_len: usize,
}

impl GraphSizes {
    pub(crate) fn prefix_len(&self, a: &Arch) -> usize {
        self.cameras * a.tokens_per_image() + self.prompt_len
    }
}

pub(crate) fn suffix_len(a: &Arch) -> usize {
    a.chunk + usize::from(a.variant == Variant::Pi0)
}

/// Graph input and output names (shared with the runtimes through the manifest).
pub(crate) mod names {
    pub(crate) const LANG_TOKENS: &str = "lang_tokens";
    pub(crate) const PREFIX_BIAS: &str = "prefix_bias";
    pub(crate) const PREFIX_COS: &str = "prefix_cos";
    pub(crate) const PREFIX_SIN: &str = "prefix_sin";
    pub(crate) const KV_CACHE: &str = "kv_cache";
    pub(crate) const STATE: &str = "state";
    pub(crate) const X_T: &str = "x_t";
    pub(crate) const TIME_EMB: &str = "time_emb";
    pub(crate) const SUFFIX_BIAS: &str = "suffix_bias";
    pub(crate) const SUFFIX_COS: &str = "suffix_cos";
    pub(crate) const SUFFIX_SIN: &str = "suffix_sin";
    pub(crate) const X_NEXT: &str = "x_next";
    pub(crate) const NOISE: &str = "noise";
    pub(crate) const ACTIONS: &str = "actions";
    /// Real-time chunking (`--rtc`): the leftover `[B, chunk, action_dim]`, its per-step
    /// weights `[B, chunk, 1]` and each Euler step's guidance weight `[steps]`.
    pub(crate) const RTC_TARGET: &str = "rtc_target";
    pub(crate) const RTC_WEIGHTS: &str = "rtc_weights";
    pub(crate) const RTC_GUIDANCE: &str = "rtc_guidance";
    /// Training-time real-time chunking (a checkpoint trained for it): which action tokens are
    /// clamped to the leftover, `[B, chunk, 1]` (1 or 0), and for unrolled graphs the values
    /// they are clamped to, `[B, chunk, action_dim]`.
    pub(crate) const RTC_CLEAN: &str = "rtc_clean";
    pub(crate) const RTC_CLEAN_VALUES: &str = "rtc_clean_values";

    pub(crate) fn image(i: usize) -> String {
        format!("image{i}")
    }
}

/// Builds the graphs of one checkpoint.
pub(crate) struct Pi0GraphBuilder<'a> {
    ck: &'a Checkpoint,
    pub(crate) arch: Arch,
    pub(crate) dtype: ExportDtype,
    pub(crate) sizes: GraphSizes,
    /// Float linear weights of the default groups quantized into the graphs (`--quant`).
    pub(crate) quant: Option<Scheme>,
    /// A pi0.5 trained for real-time chunking: the denoise graph takes which action tokens are
    /// clamped (`names::RTC_CLEAN`) and runs them at flow time 0.
    pub(crate) trained_rtc: bool,
}

/// Training-time real-time chunking in the denoise graph: `clean` (1 for a clamped token) and
/// `keep` (`1 - clean`), in the compute type, `[B, chunk, 1]`; for unrolled graphs the values the
/// clamped steps take (f32 `[B, chunk, action_dim]`) and the two selectors in f32.
struct Clean {
    clean: String,
    keep: String,
    values: Option<(String, String, String)>,
}

/// The unrolled graph's real-time-chunking inputs (`names::RTC_*`).
struct RtcInputs {
    target: String,
    weights: String,
    guidance: String,
}

/// RoPE tables of a graph, reshaped for broadcasting over heads: `[B, S, 1, hd]`.
struct Rope {
    cos: String,
    sin: String,
    seq: usize,
}

enum NormKind {
    /// `(1 + w)` as an f32 initializer.
    Rms(String),
    /// pi0.5: `scale`, `shift` (compute type, `[B, 1, W]`).
    Adaptive(String, String),
}

impl<'a> Pi0GraphBuilder<'a> {
    pub(crate) fn new(
        ck: &'a Checkpoint,
        arch: Arch,
        dtype: ExportDtype,
        sizes: GraphSizes,
    ) -> Self {
        Pi0GraphBuilder {
            ck,
            arch,
            dtype,
            sizes,
            quant: None,
            trained_rtc: false,
        }
    }

    fn ct(&self) -> i32 {
        self.dtype.compute()
    }

    /// `x` cast to `to` unless it already has that type (`from`).
    fn cast(g: &mut GraphBuilder<'a>, x: &str, from: i32, to: i32) -> String {
        if from == to {
            x.to_string()
        } else {
            g.op("Cast", &[x], vec![attr_int("to", to as i64)])
        }
    }

    /// A stored weight made available in the compute type.
    fn stored(
        &self,
        g: &mut GraphBuilder<'a>,
        name: &str,
        dims: &[usize],
        src: F32Source<'a>,
    ) -> String {
        let w = g.weight(name, dims, self.dtype.storage(), src);
        if self.dtype.storage() == self.ct() {
            w
        } else {
            g.cast_initializer(&w, self.ct())
        }
    }

    /// An f32 initializer (norm parameters), whatever the export type.
    fn f32_weight(
        &self,
        g: &mut GraphBuilder<'a>,
        name: &str,
        dims: &[usize],
        src: F32Source<'a>,
    ) -> String {
        g.weight(name, dims, data_type::FLOAT, src)
    }

    fn tensor_src(&self, name: String, shape: Vec<usize>) -> F32Source<'a> {
        let ck = self.ck;
        Box::new(move || Ok(ck.take(&[&name], &shape)?.data.to_vec()))
    }

    /// `x @ W^T (+ b)` for the checkpoint's Linear `base` (`[out, in]`); weights of several
    /// Linears sharing the input are concatenated (fused) and the result split back.
    fn linears(
        &self,
        g: &mut GraphBuilder<'a>,
        x: &str,
        parts: &[(&str, usize)],
        inp: usize,
        bias: bool,
    ) -> Vec<String> {
        let ck = self.ck;
        let total: usize = parts.iter().map(|p| p.1).sum();
        let owned: Vec<(String, usize)> = parts.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        let key = if parts.len() == 1 {
            format!("{}.weight", parts[0].0)
        } else {
            format!("{}+{}parts.weight", parts[0].0, parts.len())
        };
        let forms: Vec<Form> = parts.iter().map(|p| self.form(p.0, inp)).collect();
        let scaled: Vec<bool> = parts
            .iter()
            .map(|p| ck.contains(&format!("{}.weight{INPUT_SCALE}", p.0)))
            .collect();
        let rotated: Vec<bool> = parts
            .iter()
            .map(|p| ck.rotated.contains(&format!("{}.weight", p.0)))
            .collect();
        if forms.iter().any(|f| *f != forms[0])
            || scaled.iter().any(|s| *s != scaled[0])
            || rotated.iter().any(|r| *r != rotated[0])
        {
            // Parts stored differently (a w4 checkpoint keeps some weights w8): one product
            // each.
            return parts
                .iter()
                .map(|&(name, out)| self.linear(g, x, name, out, inp, bias))
                .collect();
        }
        let rotated_x;
        let x = if rotated[0] {
            // `w8a8`'s rotated layers: the weight is stored as `W R`, so the input is `x R`.
            rotated_x = self.rotate(g, x, inp);
            rotated_x.as_str()
        } else {
            x
        };
        let scaled_x;
        let x = if scaled[0] {
            // Calibrated (`pi0d quantize --calibration`): the weight is stored as `W diag(s)`,
            // so the input is divided by `s`, which the parts sharing it share.
            let names: Vec<String> = parts.iter().map(|p| format!("{}.weight", p.0)).collect();
            let inv = self.stored(
                g,
                &key.replace(".weight", ".input_scale_inv"),
                &[inp],
                Box::new(move || {
                    let scale = |n: &String| ck.input_scale(&[n.as_str()], inp);
                    let first = scale(&names[0])?.unwrap_or_default();
                    for n in &names[1..] {
                        if scale(n)?.unwrap_or_default() != first {
                            return Err(ExportError::Invalid(format!(
                                "`{n}{INPUT_SCALE}` differs from `{}{INPUT_SCALE}`: weights that share an input must share its scales",
                                names[0]
                            )));
                        }
                    }
                    Ok(first.into_vec())
                }),
            );
            scaled_x = g.op("Mul", &[x, &inv], vec![]);
            scaled_x.as_str()
        } else {
            x
        };
        let group = group_of(&key);
        g.probe(x, group, ProbeKind::LinearIn);
        let mut y = if forms[0] == Form::Float {
            self.float_matmul(g, x, &key, &owned, inp)
        } else {
            self.quantized_matmul(g, x, &key, &owned, inp, forms[0])
        };
        if bias {
            let bparts = owned.clone();
            let b = self.stored(
                g,
                &key.replace(".weight", ".bias"),
                &[total],
                Box::new(move || {
                    let mut out = Vec::with_capacity(total);
                    for (name, o) in &bparts {
                        out.extend_from_slice(&ck.take(&[&format!("{name}.bias")], &[*o])?.data);
                    }
                    Ok(out)
                }),
            );
            y = g.op("Add", &[&y, &b], vec![]);
        }
        g.probe(&y, group, ProbeKind::LinearOut);
        if parts.len() == 1 {
            return vec![y];
        }
        let sizes: Vec<i64> = parts.iter().map(|p| p.1 as i64).collect();
        let split = g.i64s(&sizes);
        g.op_n(
            "Split",
            &[&y, &split],
            parts.len(),
            vec![attr_int("axis", -1)],
        )
    }

    /// `x @ W^T` for float Linears `parts` (`[out, inp]` each), fused along `out` into one
    /// `[inp, total]` weight `key`.
    fn float_matmul(
        &self,
        g: &mut GraphBuilder<'a>,
        x: &str,
        key: &str,
        parts: &[(String, usize)],
        inp: usize,
    ) -> String {
        let ck = self.ck;
        let total: usize = parts.iter().map(|p| p.1).sum();
        let wparts = parts.to_vec();
        let w = self.stored(
            g,
            key,
            &[inp, total],
            Box::new(move || {
                let mut out = vec![0.0f32; inp * total];
                let mut col = 0;
                for (name, o) in &wparts {
                    let t = ck.take(&[&format!("{name}.weight")], &[*o, inp])?;
                    for r in 0..*o {
                        for i in 0..inp {
                            out[i * total + col + r] = t.data[r * inp + i];
                        }
                    }
                    col += o;
                }
                Ok(out)
            }),
        );
        g.op("MatMul", &[x, &w], vec![])
    }

    fn linear(
        &self,
        g: &mut GraphBuilder<'a>,
        x: &str,
        base: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> String {
        self.linears(g, x, &[(base, out)], inp, bias).remove(0)
    }

    /// `x R` over `x`'s last axis of `k` (`pi0d_kernels::hadamard`: each channel's sign, then
    /// a Walsh-Hadamard transform per block of the binary expansion of `k`). A block of
    /// `n = a b` is `H_a X H_b` on the block reshaped to `[a, b]` (Sylvester's `H_n` is
    /// `H_a ⊗ H_b`): two small MatMuls instead of an `n x n` one.
    fn rotate(&self, g: &mut GraphBuilder<'a>, x: &str, k: usize) -> String {
        let ct = self.ct();
        let constant = |g: &mut GraphBuilder<'a>, name: String, dims: &[usize], v: Vec<f32>| {
            let w = g.weight(
                &name,
                dims,
                data_type::FLOAT,
                Box::new(move || Ok(v.clone())),
            );
            Self::cast(g, &w, data_type::FLOAT, ct)
        };
        let signs = constant(
            g,
            format!("hadamard.signs.{k}"),
            &[k],
            (0..k).map(hadamard::sign).collect(),
        );
        let signed = g.op("Mul", &[x, &signs], vec![]);
        let shape = g.op("Shape", &[x], vec![]);
        let blocks: Vec<(usize, usize)> = hadamard::blocks(k).collect();
        let pieces = if blocks.len() == 1 {
            vec![signed]
        } else {
            let sizes: Vec<i64> = blocks.iter().map(|b| b.1 as i64).collect();
            let split = g.i64s(&sizes);
            g.op_n(
                "Split",
                &[&signed, &split],
                blocks.len(),
                vec![attr_int("axis", -1)],
            )
        };
        let mut turned = Vec::with_capacity(pieces.len());
        for (piece, &(_, n)) in pieces.iter().zip(&blocks) {
            let a = 1usize << (n.trailing_zeros() / 2);
            let b = n / a;
            let h = |g: &mut GraphBuilder<'a>, m: usize| {
                constant(g, format!("hadamard.{m}"), &[m, m], hadamard::matrix(m))
            };
            let (ha, hb) = (h(g, a), h(g, b));
            let grid = Self::reshape_i64(g, piece, &[-1, a as i64, b as i64]);
            let right = g.op("MatMul", &[&grid, &hb], vec![]);
            let both = g.op("MatMul", &[&ha, &right], vec![]);
            turned.push(Self::reshape_i64(g, &both, &[-1, n as i64]));
        }
        let joined = if turned.len() == 1 {
            turned.remove(0)
        } else {
            let refs: Vec<&str> = turned.iter().map(String::as_str).collect();
            g.op("Concat", &refs, vec![attr_int("axis", -1)])
        };
        g.op("Reshape", &[&joined, &shape], vec![])
    }

    fn reshape_i64(g: &mut GraphBuilder<'a>, x: &str, shape: &[i64]) -> String {
        let s = g.i64s(shape);
        g.op("Reshape", &[x, &s], vec![])
    }

    fn reshape(g: &mut GraphBuilder<'a>, x: &str, shape: &[usize]) -> String {
        let s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let s = g.i64s(&s);
        g.op("Reshape", &[x, &s], vec![])
    }

    fn transpose_op(g: &mut GraphBuilder<'a>, x: &str, perm: &[i64]) -> String {
        g.op("Transpose", &[x], vec![attr_ints("perm", perm)])
    }

    fn gelu_tanh(&self, g: &mut GraphBuilder<'a>, x: &str) -> String {
        let ct = self.ct();
        let c = g.scalar(0.797_884_6, ct);
        let k = g.scalar(0.044_715, ct);
        let half = g.scalar(0.5, ct);
        let one = g.scalar(1.0, ct);
        let x2 = g.op("Mul", &[x, x], vec![]);
        let x3 = g.op("Mul", &[&x2, x], vec![]);
        let kx3 = g.op("Mul", &[&x3, &k], vec![]);
        let inner = g.op("Add", &[x, &kx3], vec![]);
        let inner = g.op("Mul", &[&inner, &c], vec![]);
        let t = g.op("Tanh", &[&inner], vec![]);
        let t1 = g.op("Add", &[&t, &one], vec![]);
        let hx = g.op("Mul", &[x, &half], vec![]);
        g.op("Mul", &[&hx, &t1], vec![])
    }

    fn silu(g: &mut GraphBuilder<'a>, x: &str) -> String {
        let s = g.op("Sigmoid", &[x], vec![]);
        g.op("Mul", &[x, &s], vec![])
    }

    /// Gemma RMSNorm (statistics in f32), or pi0.5's adaptive form.
    fn rms_norm(&self, g: &mut GraphBuilder<'a>, x: &str, kind: &NormKind) -> String {
        let ct = self.ct();
        let x32 = Self::cast(g, x, ct, data_type::FLOAT);
        let sq = g.op("Mul", &[&x32, &x32], vec![]);
        let var = g.op(
            "ReduceMean",
            &[&sq],
            vec![attr_ints("axes", &[-1]), attr_int("keepdims", 1)],
        );
        let eps = g.scalar(RMS_EPS, data_type::FLOAT);
        let var = g.op("Add", &[&var, &eps], vec![]);
        let den = g.op("Sqrt", &[&var], vec![]);
        let n = g.op("Div", &[&x32, &den], vec![]);
        match kind {
            NormKind::Rms(w1) => {
                let y = g.op("Mul", &[&n, w1], vec![]);
                Self::cast(g, &y, data_type::FLOAT, ct)
            }
            NormKind::Adaptive(scale, shift) => {
                let n = Self::cast(g, &n, data_type::FLOAT, ct);
                let one = g.scalar(1.0, ct);
                let s1 = g.op("Add", &[scale, &one], vec![]);
                let y = g.op("Mul", &[&n, &s1], vec![]);
                g.op("Add", &[&y, shift], vec![])
            }
        }
    }

    /// `1 + w` of an RMSNorm weight, as an f32 initializer.
    fn rms_weight(&self, g: &mut GraphBuilder<'a>, base: &str, width: usize) -> NormKind {
        let ck = self.ck;
        let name = format!("{base}.weight");
        let n2 = name.clone();
        NormKind::Rms(self.f32_weight(
            g,
            &format!("{base}.one_plus_weight"),
            &[width],
            Box::new(move || {
                Ok(ck
                    .take(&[&n2], &[width])?
                    .data
                    .iter()
                    .map(|w| 1.0 + w)
                    .collect())
            }),
        ))
    }

    /// SigLIP's LayerNorm (eps 1e-6), in f32.
    fn layer_norm(&self, g: &mut GraphBuilder<'a>, x: &str, base: &str, width: usize) -> String {
        let ct = self.ct();
        let w = self.f32_weight(
            g,
            &format!("{base}.weight"),
            &[width],
            self.tensor_src(format!("{base}.weight"), vec![width]),
        );
        let b = self.f32_weight(
            g,
            &format!("{base}.bias"),
            &[width],
            self.tensor_src(format!("{base}.bias"), vec![width]),
        );
        g.probe(x, group_of(base), ProbeKind::Stream);
        let x32 = Self::cast(g, x, ct, data_type::FLOAT);
        let axes = vec![attr_ints("axes", &[-1]), attr_int("keepdims", 1)];
        let mean = g.op("ReduceMean", &[&x32], axes.clone());
        let d = g.op("Sub", &[&x32, &mean], vec![]);
        let d2 = g.op("Mul", &[&d, &d], vec![]);
        let var = g.op("ReduceMean", &[&d2], axes);
        let eps = g.scalar(1e-6, data_type::FLOAT);
        let var = g.op("Add", &[&var, &eps], vec![]);
        let den = g.op("Sqrt", &[&var], vec![]);
        let n = g.op("Div", &[&d, &den], vec![]);
        let y = g.op("Mul", &[&n, &w], vec![]);
        let y = g.op("Add", &[&y, &b], vec![]);
        Self::cast(g, &y, data_type::FLOAT, ct)
    }

    /// Grouped-query attention: `q` `[X, S, heads*hd]`, `k`/`v` `[X, T, kv*hd]`, optional f32
    /// additive `bias` `[X, 1, 1, S, T]`; softmax in f32. Returns `[X, S, heads*hd]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        g: &mut GraphBuilder<'a>,
        q: &str,
        k: &str,
        v: &str,
        (x, s, t): (usize, usize, usize),
        (heads, kv, hd): (usize, usize, usize),
        bias: Option<&str>,
    ) -> String {
        let ct = self.ct();
        let group = heads / kv;
        let scale = g.scalar((hd as f32).powf(-0.5), ct);
        let q = g.op("Mul", &[q, &scale], vec![]);
        let q = Self::reshape(g, &q, &[x, s, kv, group, hd]);
        let q = Self::transpose_op(g, &q, &[0, 2, 3, 1, 4]);
        let k = Self::reshape(g, k, &[x, t, kv, 1, hd]);
        let k = Self::transpose_op(g, &k, &[0, 2, 3, 4, 1]);
        let v = Self::reshape(g, v, &[x, t, kv, 1, hd]);
        let v = Self::transpose_op(g, &v, &[0, 2, 3, 1, 4]);
        let scores = g.op("MatMul", &[&q, &k], vec![]);
        let mut s32 = Self::cast(g, &scores, ct, data_type::FLOAT);
        if let Some(b) = bias {
            s32 = g.op("Add", &[&s32, b], vec![]);
        }
        let p = g.op("Softmax", &[&s32], vec![attr_int("axis", -1)]);
        let p = Self::cast(g, &p, data_type::FLOAT, ct);
        let o = g.op("MatMul", &[&p, &v], vec![]);
        let o = Self::transpose_op(g, &o, &[0, 3, 1, 2, 4]);
        Self::reshape(g, &o, &[x, s, heads * hd])
    }

    /// RoPE tables from `[B, S, hd]` f32 inputs.
    fn rope_tables(&self, g: &mut GraphBuilder<'a>, cos: &str, sin: &str, seq: usize) -> Rope {
        let (b, hd, ct) = (self.sizes.batch, self.arch.head_dim, self.ct());
        let mut t = |x: &str| {
            let x = Self::cast(g, x, data_type::FLOAT, ct);
            Self::reshape(g, &x, &[b, seq, 1, hd])
        };
        Rope {
            cos: t(cos),
            sin: t(sin),
            seq,
        }
    }

    /// `rotate_half` RoPE on `[B, S, heads*hd]`.
    fn rope(&self, g: &mut GraphBuilder<'a>, x: &str, heads: usize, r: &Rope) -> String {
        let (b, hd) = (self.sizes.batch, self.arch.head_dim);
        let x4 = Self::reshape(g, x, &[b, r.seq, heads, hd]);
        let split = g.i64s(&[hd as i64 / 2, hd as i64 / 2]);
        let halves = g.op_n("Split", &[&x4, &split], 2, vec![attr_int("axis", -1)]);
        let neg = g.op("Neg", &[&halves[1]], vec![]);
        let rot = g.op("Concat", &[&neg, &halves[0]], vec![attr_int("axis", -1)]);
        let a = g.op("Mul", &[&x4, &r.cos], vec![]);
        let c = g.op("Mul", &[&rot, &r.sin], vec![]);
        let y = g.op("Add", &[&a, &c], vec![]);
        Self::reshape(g, &y, &[b, r.seq, heads * hd])
    }

    /// One Gemma decoder layer on `x` `[B, S, width]`. Returns `(x, k, v)` with this layer's
    /// post-RoPE keys and values `[B, S, kv*hd]`. `cached` prepends the prefix's K/V;
    /// `kv_only` stops once K/V are known (the last prefix layer).
    #[allow(clippy::too_many_arguments)]
    fn gemma_layer(
        &self,
        g: &mut GraphBuilder<'a>,
        base: &str,
        x: &str,
        (width, mlp): (usize, usize),
        rope: &Rope,
        bias: &str,
        cached: Option<(&str, &str, usize)>,
        modulation: Option<&[String; 6]>,
        kv_only: bool,
    ) -> (String, String, String) {
        let a = &self.arch;
        let (h, kh, hd) = (a.heads, a.kv_heads, a.head_dim);
        let (b, s) = (self.sizes.batch, rope.seq);
        let in_norm = match modulation {
            Some(m) => NormKind::Adaptive(m[0].clone(), m[1].clone()),
            None => self.rms_weight(g, &format!("{base}.input_layernorm"), width),
        };
        g.probe(x, group_of(base), ProbeKind::Stream);
        let hn = self.rms_norm(g, x, &in_norm);
        let qkv = self.linears(
            g,
            &hn,
            &[
                (&format!("{base}.self_attn.q_proj"), h * hd),
                (&format!("{base}.self_attn.k_proj"), kh * hd),
                (&format!("{base}.self_attn.v_proj"), kh * hd),
            ],
            width,
            false,
        );
        let q = self.rope(g, &qkv[0], h, rope);
        let k = self.rope(g, &qkv[1], kh, rope);
        let v = qkv[2].clone();
        if kv_only {
            return (x.to_string(), k, v);
        }
        let (kk, vv, t) = match cached {
            Some((kp, vp, p)) => (
                g.op("Concat", &[kp, &k], vec![attr_int("axis", 1)]),
                g.op("Concat", &[vp, &v], vec![attr_int("axis", 1)]),
                p + s,
            ),
            None => (k.clone(), v.clone(), s),
        };
        let att = self.attention(g, &q, &kk, &vv, (b, s, t), (h, kh, hd), Some(bias));
        let o = self.linear(
            g,
            &att,
            &format!("{base}.self_attn.o_proj"),
            width,
            h * hd,
            false,
        );
        let o = match modulation {
            Some(m) => g.op("Mul", &[&o, &m[2]], vec![]),
            None => o,
        };
        let x = g.op("Add", &[x, &o], vec![]);
        let post_norm = match modulation {
            Some(m) => NormKind::Adaptive(m[3].clone(), m[4].clone()),
            None => self.rms_weight(g, &format!("{base}.post_attention_layernorm"), width),
        };
        g.probe(&x, group_of(base), ProbeKind::Stream);
        let hn = self.rms_norm(g, &x, &post_norm);
        let gu = self.linears(
            g,
            &hn,
            &[
                (&format!("{base}.mlp.gate_proj"), mlp),
                (&format!("{base}.mlp.up_proj"), mlp),
            ],
            width,
            false,
        );
        let act = self.gelu_tanh(g, &gu[0]);
        let m = g.op("Mul", &[&act, &gu[1]], vec![]);
        let d = self.linear(g, &m, &format!("{base}.mlp.down_proj"), width, mlp, false);
        let d = match modulation {
            Some(m) => g.op("Mul", &[&d, &m[5]], vec![]),
            None => d,
        };
        (g.op("Add", &[&x, &d], vec![]), k, v)
    }
}

mod denoise;
mod prefix;
pub(crate) mod qlinear;
