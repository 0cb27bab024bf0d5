//! Weight-only quantization: int8 with one scale per output row, int4 in blocks along `k` with
//! one scale per block (ggml's Q4_0 rule, or the symmetric grid where that rounds closer). The packed kernels widen the stored integers to f32
//! and apply the scales as they load them, so a product computes `a x dequant(W)^T` in f32; only
//! the weight's memory (and the bytes each product streams) shrinks, to ~1 or ~0.56 byte a value.
//!
//! The int4 layout, row-major `[n, k/2]` bytes with the even column of a pair in the low nibble
//! and scales `[n, k/block]`, is the layout of ONNX Runtime's `com.microsoft.MatMulNBits` with
//! `bits = 4`, `block_size = block` and no `zero_points` input. What matches: `B`'s shape
//! `[N, k_blocks, block/2]` is our `[n, k/2]` read block by block, codes packed low-first along K,
//! `scales` `[N, k_blocks]`, the default zero point 2^(bits-1) = 8, dequantized
//! `(code - 8) * scale`. What differs: the operator also takes a K that is not a multiple of the
//! block (a padded last block), explicit zero points, f16 scales and a bias, and leaves the
//! rounding rule to whoever quantized (ours is Q4_0's, `d = m / -8`); ggml's own Q4_0 blocks
//! order their nibbles differently (byte `j` holds values `j` and `j + 16` of a 32-block) and
//! store `d` as f16, so only the rule is shared with ggml, not the bytes.

use thiserror::Error;

/// Why a weight was not quantized.
#[derive(Clone, Copy, Debug, PartialEq, Error)]
pub enum QuantError {
    #[error("int4 block of {0} values: must be a power of two of at least 16")]
    BadBlock(usize),
    #[error("k = {k} is not a multiple of the int4 block ({block})")]
    KNotMultipleOfBlock { k: usize, block: usize },
    #[error("weight has {len} values, not {n} x {k}")]
    Shape { len: usize, n: usize, k: usize },
    #[error("weight value at row {row}, column {col} is {value}: not finite")]
    NonFinite { row: usize, col: usize, value: f32 },
}

/// An int8 weight `[n, k]`: value `(r, c)` is `q[r * k + c] as f32 * scales[r]`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantI8 {
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
}

/// An int4 weight `[n, k]`: byte `r * k/2 + c/2` holds column `c` in its low nibble when `c` is
/// even, its high nibble when odd; value `(r, c)` is `(nibble - 8) * scales[r * k/block + c/block]`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantI4 {
    pub packed: Vec<u8>,
    pub scales: Vec<f32>,
    pub block: usize,
}

/// Quantizes row-major `w` (`[n, k]`, PyTorch's `[out, in]`) to int8, symmetric, one scale per
/// output row: `scale = absmax / 127`, `q = round(w / scale)`. A row of zeros gets scale 0 (and
/// all `q` 0), so it dequantizes to exact zeros without a special case anywhere else.
pub fn quantize_i8_rows(w: &[f32], n: usize, k: usize) -> Result<QuantI8, QuantError> {
    check(w, n, k)?;
    let mut q = vec![0i8; n * k];
    let mut scales = vec![0.0f32; n];
    for (r, (row, qrow)) in w
        .chunks_exact(k.max(1))
        .zip(q.chunks_exact_mut(k.max(1)))
        .enumerate()
    {
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if absmax == 0.0 {
            continue;
        }
        let scale = absmax / 127.0;
        scales[r] = scale;
        for (qv, &v) in qrow.iter_mut().zip(row) {
            *qv = (v / scale).round().clamp(-127.0, 127.0) as i8;
        }
    }
    Ok(QuantI8 { q, scales })
}

/// Quantizes row-major `w` (`[n, k]`) to int4 in blocks of `block` values along `k`, by ggml's
/// Q4_0 rule: `m` is the block's value of largest magnitude (sign kept), `d = m / -8` or, where
/// it rounds the block closer, `m / 7` (`best_int4_scale`); `q = clamp(round(x / d) + 8, 0, 15)`. A block of zeros gets `d = 0` and
/// codes 8 (value 0).
pub fn quantize_i4_blocks(
    w: &[f32],
    n: usize,
    k: usize,
    block: usize,
) -> Result<QuantI4, QuantError> {
    if block < 16 || !block.is_power_of_two() {
        return Err(QuantError::BadBlock(block));
    }
    if !k.is_multiple_of(block) {
        return Err(QuantError::KNotMultipleOfBlock { k, block });
    }
    check(w, n, k)?;
    let blocks = k / block;
    let mut packed = vec![0u8; n * k / 2];
    let mut scales = vec![0.0f32; n * blocks];
    for r in 0..n {
        for b in 0..blocks {
            let x = &w[r * k + b * block..][..block];
            let d = int4_block_scale(x);
            scales[r * blocks + b] = d;
            for (i, pair) in x.chunks_exact(2).enumerate() {
                let code = |v: f32| {
                    if d == 0.0 {
                        8
                    } else {
                        ((v / d).round() + 8.0).clamp(0.0, 15.0) as u8
                    }
                };
                packed[(r * k + b * block) / 2 + i] = code(pair[0]) | code(pair[1]) << 4;
            }
        }
    }
    Ok(QuantI4 {
        packed,
        scales,
        block,
    })
}

/// The scale `d` of one int4 block `x` (codes `round(x / d) + 8`, clamped to 0..=15; 0 for a
/// block of zeros), by the rule `quantize_i4_blocks` documents.
pub fn int4_block_scale(x: &[f32]) -> f32 {
    let m = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if m == 0.0 {
        0.0
    } else {
        best_int4_scale(x, m)
    }
}

/// Whichever of Q4_0's `d = m / -8` (the block's largest magnitude `m` on code 0, its opposite
/// clamped to code 15) and `d = m / 7` (`m` on code 15, the grid symmetric) rounds `x` with the
/// smaller squared error. (A wider search that also shrinks the scale, clipping the largest
/// values, lowers the weights' error but raised the actions' error against lerobot's on the
/// golden models: the largest weights matter more than their share of the squared error.)
fn best_int4_scale(x: &[f32], m: f32) -> f32 {
    let sse = |d: f32| -> f64 {
        x.iter()
            .map(|&v| {
                let e = v - (v / d).round().clamp(-8.0, 7.0) * d;
                (e as f64) * (e as f64)
            })
            .sum()
    };
    let (q4_0, symmetric) = (m / -8.0, m / 7.0);
    if sse(symmetric) < sse(q4_0) {
        symmetric
    } else {
        q4_0
    }
}

/// The length and finiteness of a weight to quantize.
fn check(w: &[f32], n: usize, k: usize) -> Result<(), QuantError> {
    if w.len() != n * k {
        return Err(QuantError::Shape { len: w.len(), n, k });
    }
    match w.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(QuantError::NonFinite {
            row: i / k,
            col: i % k,
            value: w[i],
        }),
        None => Ok(()),
    }
}

impl QuantI8 {
    /// Value `(r, c)` of the weight (`k` values a row).
    #[inline]
    pub fn value(&self, k: usize, r: usize, c: usize) -> f32 {
        self.q[r * k + c] as f32 * self.scales[r]
    }
}

impl QuantI4 {
    /// The 4-bit code of value `(r, c)` (`k` values a row).
    #[inline]
    pub fn code(&self, k: usize, r: usize, c: usize) -> u8 {
        (self.packed[(r * k + c) / 2] >> (4 * (c & 1))) & 0xF
    }

    /// Value `(r, c)` of the weight (`k` values a row).
    #[inline]
    pub fn value(&self, k: usize, r: usize, c: usize) -> f32 {
        let d = self.scales[r * (k / self.block) + c / self.block];
        (self.code(k, r, c) as i32 - 8) as f32 * d
    }
}

/// The f32 weight `[n, k]` an int8 one stands for.
pub fn dequantize_i8(q: &QuantI8, n: usize, k: usize) -> Vec<f32> {
    (0..n * k).map(|i| q.value(k, i / k, i % k)).collect()
}

/// The f32 weight `[n, k]` an int4 one stands for.
pub fn dequantize_i4(q: &QuantI4, n: usize, k: usize) -> Vec<f32> {
    (0..n * k).map(|i| q.value(k, i / k, i % k)).collect()
}
