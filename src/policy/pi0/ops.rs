//! Numeric building blocks, each matching its PyTorch counterpart in lerobot / transformers
//! (f32 compute; storage-type rounding where PyTorch computes in bf16/f16 is noted).

use gemm::Parallelism;

use super::checkpoint::{Checkpoint, CheckpointError, WeightDtype, Weights};

thread_local! {
    /// Depth of GEMM-library calls on this thread. The `gemm` crate allocates its packing
    /// buffers inside every call; this lets an allocation test tell those apart from pi0d's own.
    pub static IN_GEMM: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` (a call into the GEMM library) with `IN_GEMM` raised.
fn in_gemm(f: impl FnOnce()) {
    IN_GEMM.with(|d| d.set(d.get() + 1));
    f();
    IN_GEMM.with(|d| d.set(d.get() - 1));
}

/// The additive attention mask value openpi and lerobot use for masked positions.
pub const MASK_VALUE: f32 = -2.381_976_3e38;

/// `y = x W^T + b`, with PyTorch's `[out, in]` weight layout.
pub struct Linear {
    pub w: Weights,
    pub b: Option<Vec<f32>>,
    pub out_dim: usize,
    pub in_dim: usize,
    pub dtype: WeightDtype,
}

impl Linear {
    pub fn load(
        ck: &Checkpoint,
        names: &[&str],
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> Result<Linear, CheckpointError> {
        let wn: Vec<String> = names.iter().map(|n| format!("{n}.weight")).collect();
        let wr: Vec<&str> = wn.iter().map(String::as_str).collect();
        let w = ck.take(&wr, &[out_dim, in_dim])?;
        let b = if bias {
            let bn: Vec<String> = names.iter().map(|n| format!("{n}.bias")).collect();
            let br: Vec<&str> = bn.iter().map(String::as_str).collect();
            Some(ck.take(&br, &[out_dim])?.data.to_vec())
        } else {
            None
        };
        Ok(Linear {
            dtype: w.dtype,
            w: w.data,
            b,
            out_dim,
            in_dim,
        })
    }

    /// `out[rows, out_dim] = x[rows, in_dim] W^T (+ b)`.
    pub fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], par: Parallelism) {
        debug_assert!(x.len() >= rows * self.in_dim && out.len() >= rows * self.out_dim);
        matmul_bt(x, &self.w, out, rows, self.in_dim, self.out_dim, 1.0, par);
        if let Some(b) = &self.b {
            for row in out[..rows * self.out_dim].chunks_exact_mut(self.out_dim) {
                for (o, bb) in row.iter_mut().zip(b) {
                    *o += bb;
                }
            }
        }
    }

    pub fn apply(&self, x: &[f32], rows: usize, par: Parallelism) -> Vec<f32> {
        let mut out = vec![0.0; rows * self.out_dim];
        self.forward(x, rows, &mut out, par);
        out
    }
}

/// `out[m, n] = scale * a[m, k] b[n, k]^T`, row-major.
#[allow(clippy::too_many_arguments)]
pub fn matmul_bt(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scale: f32,
    par: Parallelism,
) {
    assert!(a.len() >= m * k && b.len() >= n * k && out.len() >= m * n);
    // SAFETY: bounds asserted above; strides describe row-major a, b^T and out.
    in_gemm(|| unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            0.0,
            scale,
            false,
            false,
            false,
            par,
        );
    });
}

/// SigLIP LayerNorm (biased variance, affine).
pub struct LayerNorm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub eps: f32,
}

impl LayerNorm {
    pub fn load(ck: &Checkpoint, name: &str, dim: usize) -> Result<LayerNorm, CheckpointError> {
        Ok(LayerNorm {
            w: ck.take(&[&format!("{name}.weight")], &[dim])?.data.to_vec(),
            b: ck.take(&[&format!("{name}.bias")], &[dim])?.data.to_vec(),
            eps: 1e-6,
        })
    }

    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.w.len();
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
pub enum Norm {
    Rms(Vec<f32>),
    Adaptive(Linear),
}

pub const RMS_EPS: f32 = 1e-6;

impl Norm {
    /// Normalizes rows of `x` into `out`; for the adaptive form `modulation` is `dense(cond)`
    /// (`[scale | shift | gate]`, 3 x dim).
    pub fn forward(&self, x: &[f32], out: &mut [f32], modulation: Option<&[f32]>) {
        let dim = match self {
            Norm::Rms(w) => w.len(),
            Norm::Adaptive(l) => l.out_dim / 3,
        };
        for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let var = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            let inv = 1.0 / (var + RMS_EPS).sqrt();
            match (self, modulation) {
                (Norm::Rms(w), _) => {
                    for i in 0..dim {
                        or[i] = xr[i] * inv * (1.0 + w[i]);
                    }
                }
                (Norm::Adaptive(_), Some(m)) => {
                    let (scale, shift) = (&m[..dim], &m[dim..2 * dim]);
                    for i in 0..dim {
                        or[i] = xr[i] * inv * (1.0 + scale[i]) + shift[i];
                    }
                }
                (Norm::Adaptive(_), None) => unreachable!("adaptive norm needs its condition"),
            }
        }
    }

    pub fn dense(&self) -> Option<&Linear> {
        match self {
            Norm::Adaptive(l) => Some(l),
            Norm::Rms(_) => None,
        }
    }
}

/// PyTorch's `gelu(approximate="tanh")`.
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Sine-cosine embedding of the flow time `t` into `out` (`[sin | cos]`, its length the
/// expert width), computed in f64 from the f32 time and cast to f32, as lerobot does.
pub fn time_embedding(t: f32, min_period: f64, max_period: f64, out: &mut [f32]) {
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
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize) -> Rope {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Rope { inv_freq }
    }

    /// `(cos, sin)` of the rotation angle for frequency `i` at `pos` (each used for both halves).
    pub fn cos_sin(&self, pos: i64, i: usize) -> (f32, f32) {
        let (sin, cos) = (pos as f32 * self.inv_freq[i]).sin_cos();
        (cos, sin)
    }

    /// Rotates each `head_dim` slice of `x` (rows of `heads * head_dim`) by its row's position.
    pub fn apply(&self, x: &mut [f32], positions: &[i64], heads: usize) {
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

/// Multi-head attention with grouped KV heads: `q` is `[s, heads*hd]`, `k`/`v` are
/// `[t, kv_heads*hd]`; `allowed(i, j)` says whether query `i` may see key `j` (others get the
/// additive mask value, as lerobot does). Softmax in f32. Writes `[s, heads*hd]`; `scores` is
/// scratch of at least `s * t`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
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
    scores: &mut [f32],
    par: Parallelism,
) {
    let scale = 1.0 / (hd as f32).sqrt();
    let group = heads / kv_heads;
    let scores = &mut scores[..s * t];
    let (qs, ks) = ((heads * hd) as isize, (kv_heads * hd) as isize);
    for h in 0..heads {
        let kh = h / group;
        // SAFETY: strided views inside q/k/v/out, sizes checked by the callers' shapes.
        in_gemm(|| unsafe {
            gemm::gemm(
                s,
                t,
                hd,
                scores.as_mut_ptr(),
                1,
                t as isize,
                false,
                q.as_ptr().add(h * hd),
                1,
                qs,
                k.as_ptr().add(kh * hd),
                ks,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                par,
            );
        });
        for (i, row) in scores.chunks_exact_mut(t).enumerate() {
            let mut max = f32::NEG_INFINITY;
            for (j, x) in row.iter_mut().enumerate() {
                if !allowed(i, j) {
                    *x += MASK_VALUE;
                }
                max = max.max(*x);
            }
            let mut sum = 0.0;
            for x in row.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            let inv = 1.0 / sum;
            row.iter_mut().for_each(|x| *x *= inv);
        }
        // SAFETY: as above.
        in_gemm(|| unsafe {
            gemm::gemm(
                s,
                hd,
                t,
                out.as_mut_ptr().add(h * hd),
                1,
                qs,
                false,
                scores.as_ptr(),
                1,
                t as isize,
                v.as_ptr().add(kh * hd),
                1,
                ks,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_bt_matches_naive() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0.0; m * n];
        matmul_bt(&a, &b, &mut out, m, k, n, 2.0, Parallelism::None);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = 2.0 * (0..k).map(|x| a[i * k + x] * b[j * k + x]).sum::<f32>();
                assert!((out[i * n + j] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn attention_with_one_visible_key_returns_its_value() {
        let (s, t, hd) = (2, 3, 4);
        let q = vec![0.3; s * 2 * hd];
        let k: Vec<f32> = (0..t * hd).map(|i| i as f32 * 0.1).collect();
        let v: Vec<f32> = (0..t * hd).map(|i| i as f32).collect();
        let mut out = vec![0.0; s * 2 * hd];
        let mut scores = vec![0.0; s * t];
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
            &mut scores,
            Parallelism::None,
        );
        for h in 0..2 {
            assert_eq!(&out[h * hd..(h + 1) * hd], &v[hd..2 * hd]);
        }
    }
}
