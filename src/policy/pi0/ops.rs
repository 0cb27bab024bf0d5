//! Numeric building blocks, each matching its PyTorch counterpart in lerobot / transformers
//! (f32 compute; storage-type rounding where PyTorch computes in bf16/f16 is noted).

use super::checkpoint::{Checkpoint, CheckpointError, Tensor, WeightDtype};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use super::hadamard;
use super::packed::int8::{I8Activations, PackedI8Matrix};
use super::packed::{PackedMatrix, Storage};
use super::quant::calibrate::{observe, observe_output, InputStats};
use super::quant::load::LinearWeight;
use super::vecmath::softmax_in_place;

/// The additive attention mask value openpi and lerobot use for masked positions.
pub(crate) const MASK_VALUE: f32 = -2.381_976_3e38;

/// `y = x W^T + b`, with PyTorch's `[out, in]` weight layout, the weight packed for the CPU's
/// matmul kernel when loaded.
pub(crate) struct Linear {
    pub(crate) w: Weights,
    pub(crate) b: Option<Vec<f32>>,
    pub(crate) out_dim: usize,
    pub(crate) in_dim: usize,
    /// A calibrated checkpoint's `1 / s` per input channel: the weight was stored as
    /// `W diag(s)`, so the input is multiplied by this first.
    pub(crate) input_scale: Option<Box<[f32]>>,
    /// The weight was stored rotated (`W R`, `w8a8`; `R` in `hadamard`): the input is rotated
    /// first (then divided by `input_scale`'s `s`, which calibration chose on rotated inputs).
    pub(crate) rotated: bool,
    /// Calibration only: where this layer reports its inputs.
    observer: Option<Arc<Mutex<InputStats>>>,
}

/// A linear layer's packed weight: multiplied in f32 (whatever it is stored in), or int8 by
/// int8 activations (`w8a8`).
pub(crate) enum Weights {
    F32(PackedMatrix),
    W8a8(PackedI8Matrix),
}

impl Weights {
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Weights::F32(w) => w.bytes(),
            Weights::W8a8(w) => w.bytes() + 4 * w.scales().len(),
        }
    }
}

/// A float weight packed in the checkpoint's own width (bf16/f16 weights take half the memory of
/// f32); the checkpoint's pages of it are released once packed.
fn pack_float(w: Tensor, out_dim: usize, in_dim: usize) -> PackedMatrix {
    let storage = match w.dtype {
        WeightDtype::F32 => Storage::F32,
        WeightDtype::Bf16 => Storage::Bf16,
        WeightDtype::F16 => Storage::F16,
    };
    let packed = PackedMatrix::pack_as(storage, &w.data, out_dim, in_dim);
    w.data.release();
    packed
}

thread_local! {
    /// Each thread's quantized activations for `w8a8` products: grown to the largest input once,
    /// then reused (the denoising loop allocates nothing).
    static ACTIVATIONS: RefCell<I8Activations> = RefCell::new(I8Activations::new());
    /// Each thread's inputs divided by a calibrated layer's `s`, grown once as above.
    static SCALED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Linear {
    pub(crate) fn load(
        ck: &Checkpoint,
        names: &[&str],
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> Result<Linear, CheckpointError> {
        let wn: Vec<String> = names.iter().map(|n| format!("{n}.weight")).collect();
        let wr: Vec<&str> = wn.iter().map(String::as_str).collect();
        let w = ck.take_linear(&wr, out_dim, in_dim)?;
        let input_scale = ck.input_scale(&wr, in_dim)?;
        let name = &ck.find(&wr)?.name;
        let rotated = ck.rotated.contains(name);
        let observer = ck.calibration.as_ref().map(|r| r.linear(name, in_dim));
        let b = if bias {
            let bn: Vec<String> = names.iter().map(|n| format!("{n}.bias")).collect();
            let br: Vec<&str> = bn.iter().map(String::as_str).collect();
            Some(ck.take(&br, &[out_dim])?.data.to_vec())
        } else {
            None
        };
        let w = match w {
            LinearWeight::Float(w) => Weights::F32(pack_float(w, out_dim, in_dim)),
            LinearWeight::Int8(q) if ck.int8_activations => Weights::W8a8(
                PackedI8Matrix::from_quant(&q, out_dim, in_dim).map_err(|e| {
                    CheckpointError::File {
                        path: ck.path.clone(),
                        message: format!("{}: {e}", wr[0]),
                    }
                })?,
            ),
            LinearWeight::Int8(q) => Weights::F32(PackedMatrix::pack_i8(&q, out_dim, in_dim)),
            LinearWeight::Int4(q) => Weights::F32(PackedMatrix::pack_i4(&q, out_dim, in_dim)),
        };
        Ok(Linear {
            w,
            b,
            out_dim,
            in_dim,
            input_scale,
            rotated,
            observer,
        })
    }

    /// From a weight tensor (`[out_dim, in_dim]` values, any shape) and an optional bias. The
    /// checkpoint's pages of the weight are released once packed: the packed copy replaces them.
    pub(crate) fn new(w: Tensor, b: Option<Vec<f32>>, out_dim: usize, in_dim: usize) -> Linear {
        Linear {
            w: Weights::F32(pack_float(w, out_dim, in_dim)),
            b,
            out_dim,
            in_dim,
            input_scale: None,
            rotated: false,
            observer: None,
        }
    }

    /// `out[rows, out_dim] = x[rows, in_dim] W^T (+ b)`, on up to `threads` threads.
    pub(crate) fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) {
        debug_assert!(x.len() >= rows * self.in_dim && out.len() >= rows * self.out_dim);
        if let Some(stats) = &self.observer {
            observe(stats, x, rows, self.in_dim);
        }
        if self.input_scale.is_none() && !self.rotated {
            return self.product(x, rows, out, threads);
        }
        let n = rows * self.in_dim;
        let scaled = |buf: &mut Vec<f32>| {
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
            buf[..n].copy_from_slice(&x[..n]);
            if self.rotated {
                hadamard::rotate_rows(&mut buf[..n], self.in_dim, threads);
            }
            if let Some(inv) = &self.input_scale {
                for row in buf[..n].chunks_exact_mut(self.in_dim) {
                    row.iter_mut().zip(inv.iter()).for_each(|(v, i)| *v *= i);
                }
            }
        };
        SCALED.with(|buf| match buf.try_borrow_mut() {
            Ok(mut buf) => {
                scaled(&mut buf);
                self.product(&buf[..n], rows, out, threads)
            }
            Err(_) => {
                let mut buf = Vec::new();
                scaled(&mut buf);
                self.product(&buf, rows, out, threads)
            }
        })
    }

    /// `forward` once the input is what the stored weight multiplies.
    fn product(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) {
        match &self.w {
            Weights::F32(w) => w.matmul(x, rows, out, threads),
            Weights::W8a8(w) => {
                let done = ACTIVATIONS.with(|a| match a.try_borrow_mut() {
                    Ok(mut a) => w.matmul_w8a8(x, rows, out, &mut a, threads),
                    // Not reentrant; a fresh scratch if it ever were.
                    Err(_) => w.matmul_w8a8(x, rows, out, &mut I8Activations::new(), threads),
                });
                if done.is_err() {
                    // A non-finite activation: the output says so too, and the chunk made of
                    // it is refused as non-finite, as in f32.
                    out[..rows * self.out_dim].fill(f32::NAN);
                }
            }
        }
        if let Some(b) = &self.b {
            for row in out[..rows * self.out_dim].chunks_exact_mut(self.out_dim) {
                for (o, bb) in row.iter_mut().zip(b) {
                    *o += bb;
                }
            }
        }
        if let Some(stats) = &self.observer {
            observe_output(stats, &out[..rows * self.out_dim]);
        }
    }

    pub(crate) fn apply(&self, x: &[f32], rows: usize, threads: usize) -> Vec<f32> {
        let mut out = vec![0.0; rows * self.out_dim];
        self.forward(x, rows, &mut out, threads);
        out
    }
}

/// Calibration only: where a norm reports the magnitudes of its input (the residual stream).
#[derive(Default)]
pub(crate) struct Probe(Option<Arc<Mutex<InputStats>>>);

impl Probe {
    /// The probe of the norm `name` while `ck` is being calibrated, else none.
    pub(crate) fn of(ck: &Checkpoint, name: &str) -> Probe {
        Probe(ck.calibration.as_ref().map(|r| r.norm(name)))
    }

    fn see(&self, x: &[f32], dim: usize) {
        if let Some(stats) = &self.0 {
            observe(stats, x, x.len() / dim.max(1), dim);
        }
    }
}

/// SigLIP LayerNorm (biased variance, affine).
pub(crate) struct LayerNorm {
    pub(crate) w: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) eps: f32,
    probe: Probe,
}

impl LayerNorm {
    pub(crate) fn load(
        ck: &Checkpoint,
        name: &str,
        dim: usize,
    ) -> Result<LayerNorm, CheckpointError> {
        Ok(LayerNorm {
            w: ck.take(&[&format!("{name}.weight")], &[dim])?.data.to_vec(),
            b: ck.take(&[&format!("{name}.bias")], &[dim])?.data.to_vec(),
            eps: 1e-6,
            probe: Probe::of(ck, &format!("{name}.weight")),
        })
    }

    pub(crate) fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.w.len();
        self.probe.see(x, d);
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mean = xr.iter().sum::<f32>() / d as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for i in 0..d {
                or[i] = (xr[i] - mean) * inv * self.w[i] + self.b[i];
            }
        }
    }
}

/// Gemma RMSNorm `x * rsqrt(mean(x²) + eps) * (1 + w)`, or pi0.5's adaptive form where a dense
/// layer of the condition gives scale, shift and a residual gate.
pub(crate) enum Norm {
    Rms(Vec<f32>, Probe),
    Adaptive(Linear, Probe),
}

pub(crate) const RMS_EPS: f32 = 1e-6;

/// An adaptive norm's modulation for a step, `dense(cond)` (`[scale | shift | gate]`, 3 x dim):
/// the step's time's for every row, or for the rows `clean` marks (training-time RTC's clamped
/// tokens) the one of time 0.
#[derive(Clone, Copy)]
pub(crate) struct Modulation<'a> {
    at_t: &'a [f32],
    at_zero: &'a [f32],
    clean: &'a [bool],
}

impl<'a> Modulation<'a> {
    /// `at_t` for every row but those `clean` marks, which take `at_zero`.
    pub(crate) fn per_row(at_t: &'a [f32], at_zero: &'a [f32], clean: &'a [bool]) -> Self {
        Modulation {
            at_t,
            at_zero,
            clean,
        }
    }

    /// Row `r`'s modulation.
    pub(crate) fn row(&self, r: usize) -> &'a [f32] {
        if self.clean.get(r).copied().unwrap_or(false) {
            self.at_zero
        } else {
            self.at_t
        }
    }
}

impl Norm {
    /// Normalizes rows of `x` into `out`; the adaptive form takes its `modulation`.
    pub(crate) fn forward(&self, x: &[f32], out: &mut [f32], modulation: Option<Modulation>) {
        let (dim, probe) = match self {
            Norm::Rms(w, probe) => (w.len(), probe),
            Norm::Adaptive(l, probe) => (l.out_dim / 3, probe),
        };
        probe.see(x, dim);
        for (r, (xr, or)) in x
            .chunks_exact(dim)
            .zip(out.chunks_exact_mut(dim))
            .enumerate()
        {
            let var = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            let inv = 1.0 / (var + RMS_EPS).sqrt();
            match (self, modulation.map(|m| m.row(r))) {
                (Norm::Rms(w, _), _) => {
                    for i in 0..dim {
                        or[i] = xr[i] * inv * (1.0 + w[i]);
                    }
                }
                (Norm::Adaptive(..), Some(m)) => {
                    let (scale, shift) = (&m[..dim], &m[dim..2 * dim]);
                    for i in 0..dim {
                        or[i] = xr[i] * inv * (1.0 + scale[i]) + shift[i];
                    }
                }
                (Norm::Adaptive(..), None) => unreachable!("adaptive norm needs its condition"),
            }
        }
    }

    pub(crate) fn dense(&self) -> Option<&Linear> {
        match self {
            Norm::Adaptive(l, _) => Some(l),
            Norm::Rms(..) => None,
        }
    }
}

/// Sine-cosine embedding of the flow time `t` into `out` (`[sin | cos]`, its length the
/// expert width), computed in f64 from the f32 time and cast to f32, as lerobot does.
pub(crate) fn time_embedding(t: f32, min_period: f64, max_period: f64, out: &mut [f32]) {
    let half = out.len() / 2;
    for j in 0..half {
        let fraction = if half > 1 {
            j as f64 / (half - 1) as f64
        } else {
            0.0
        };
        let period = min_period * (max_period / min_period).powf(fraction);
        let x = 1.0 / period * 2.0 * std::f64::consts::PI * t as f64;
        out[j] = x.sin() as f32;
        out[half + j] = x.cos() as f32;
    }
}

/// Rotary embedding tables (`rotate_half` convention, base 10000), as transformers computes
/// them in f32 for integer positions.
pub(crate) struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub(crate) fn new(head_dim: usize) -> Rope {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Rope { inv_freq }
    }

    /// `(cos, sin)` of the rotation angle for frequency `i` at `pos` (each used for both halves).
    pub(crate) fn cos_sin(&self, pos: i64, i: usize) -> (f32, f32) {
        let (sin, cos) = (pos as f32 * self.inv_freq[i]).sin_cos();
        (cos, sin)
    }

    /// Rotates each `head_dim` slice of `x` (rows of `heads * head_dim`) by its row's position.
    pub(crate) fn apply(&self, x: &mut [f32], positions: &[i64], heads: usize) {
        let half = self.inv_freq.len();
        let hd = 2 * half;
        for (row, &pos) in x.chunks_exact_mut(heads * hd).zip(positions) {
            for i in 0..half {
                let (cos, sin) = self.cos_sin(pos, i);
                for h in 0..heads {
                    let base = h * hd;
                    let x1 = row[base + i];
                    let x2 = row[base + half + i];
                    row[base + i] = x1 * cos - x2 * sin;
                    row[base + half + i] = x2 * cos + x1 * sin;
                }
            }
        }
    }
}

/// Scores held at once by `attention` (4 MiB): long prefixes run in blocks of queries.
const SCORES_CAP: usize = 1 << 20;

/// Scratch of `attention`, grown on first use and then reused.
#[derive(Default)]
pub(crate) struct AttentionScratch {
    scores: Vec<f32>,
    mask: Vec<f32>,
    keys: PackedMatrix,
    values: PackedMatrix,
}

/// Multi-head attention with grouped KV heads: `q` is `[s, heads*hd]`, `k`/`v` are
/// `[t, kv_heads*hd]`; `allowed(i, j)` says whether query `i` may see key `j` (others get the
/// additive mask value, as lerobot does). Softmax in f32. Writes `[s, heads*hd]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: usize,
    t: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    allowed: &dyn Fn(usize, usize) -> bool,
    out: &mut [f32],
    scratch: &mut AttentionScratch,
    threads: usize,
) {
    let scale = 1.0 / (hd as f32).sqrt();
    let group = heads / kv_heads;
    let (qs, ks) = (heads * hd, kv_heads * hd);
    // With one KV head (pi0's Gemma) every query head shares the keys: `q` read as
    // `[s * heads, hd]` makes all heads one product. Otherwise one product per head.
    let shared = kv_heads == 1;
    let (products, per_query) = if shared { (1, heads) } else { (heads, 1) };
    let block = (SCORES_CAP / (per_query * t).max(1)).clamp(1, s.max(1));
    let AttentionScratch {
        scores,
        mask,
        keys,
        values,
    } = scratch;
    let scores = grow(scores, block * per_query * t);
    let mask = grow(mask, t);
    for head in 0..products {
        let kh = head / group;
        if head == 0 || kh != (head - 1) / group {
            keys.repack_rows(&k[kh * hd..], t, hd, ks);
            values.repack_cols(&v[kh * hd..], t, hd, ks);
        }
        for i0 in (0..s).step_by(block) {
            let queries = block.min(s - i0);
            let rows = queries * per_query;
            let (first, stride) = if shared {
                (i0 * qs, hd)
            } else {
                (i0 * qs + head * hd, qs)
            };
            let scores = &mut scores[..rows * t];
            keys.matmul_strided(&q[first..], stride, rows, scores, t, threads);
            for (i, rows) in scores.chunks_exact_mut(per_query * t).enumerate() {
                for (j, m) in mask.iter_mut().enumerate() {
                    *m = if allowed(i0 + i, j) { 0.0 } else { MASK_VALUE };
                }
                for row in rows.chunks_exact_mut(t) {
                    row.iter_mut()
                        .zip(&*mask)
                        .for_each(|(x, m)| *x = *x * scale + m);
                    softmax_in_place(row);
                }
            }
            values.matmul_strided(scores, t, rows, &mut out[first..], stride, threads);
        }
    }
}

/// `v[..len]`, growing `v` first if it is shorter (the only allocation, on first use).
pub(crate) fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_with_one_visible_key_returns_its_value() {
        let (s, t, hd) = (2, 3, 4);
        let q = vec![0.3; s * 2 * hd];
        let k: Vec<f32> = (0..t * hd).map(|i| i as f32 * 0.1).collect();
        let v: Vec<f32> = (0..t * hd).map(|i| i as f32).collect();
        let mut out = vec![0.0; s * 2 * hd];
        attention(
            &q,
            &k,
            &v,
            s,
            t,
            2,
            1,
            hd,
            &|_, j| j == 1,
            &mut out,
            &mut AttentionScratch::default(),
            1,
        );
        for h in 0..2 {
            assert_eq!(&out[h * hd..(h + 1) * hd], &v[hd..2 * hd]);
        }
    }
}
